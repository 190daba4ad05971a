"""nanobotctl ui: a local web page over the control socket, served on 127.0.0.1 by this process (the daemon runs
no second server); uvicorn and the page are imported inside the command."""

from __future__ import annotations

import os
import socket

from nanobotd.cli.client import Client
from nanobotd.cli.invocation import EXIT_CANNOT_CONNECT, EXIT_OK, Invocation

HOST = "127.0.0.1"


def ui(invocation: Invocation) -> int:
    """Check the daemon answers, bind 127.0.0.1, print the one-time URL, open a browser, serve until ^C."""
    args = invocation.args
    invocation.client.get("/v1/status")  # nothing to serve without a daemon: say so now, not in the browser
    try:
        listener = bind(args.port)
    except OSError as exc:
        invocation.warn(f"cannot listen on {HOST}:{args.port}: {os.strerror(exc.errno) if exc.errno else exc}")
        return EXIT_CANNOT_CONNECT
    import uvicorn

    from nanobotd.cli.web.app import build_app
    from nanobotd.cli.web.guard import TOKEN_PARAM, Secrets

    port = listener.getsockname()[1]
    keys = Secrets(port)
    client = invocation.client

    def client_for(workspace: str | None) -> Client:
        return Client(client.socket_path, client.timeout, workspace or client.workspace)

    url = f"http://{HOST}:{port}/?{TOKEN_PARAM}={keys.token}"
    invocation.stdout.write(f"nanobotd's page: {url}\n(the link works once; Ctrl-C stops the page)\n")
    invocation.stdout.flush()
    if args.browser:
        open_browser(url)
    server = uvicorn.Server(uvicorn.Config(build_app(client_for, keys), log_level="warning", access_log=False,
                                           server_header=False, date_header=False))
    server.run(sockets=[listener])
    return EXIT_OK


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:*port* (0: a free port), never on another address."""
    return socket.create_server((HOST, port), backlog=64)  # SO_REUSEADDR set, closed again if binding fails


def open_browser(url: str) -> bool:
    """Open *url* in a graphical browser, never a console one (it would take over the terminal)."""
    import webbrowser

    try:
        controller = webbrowser.get()
    except webbrowser.Error:
        return False
    if type(controller) is webbrowser.GenericBrowser:  # how webbrowser registers the console browsers
        return False
    try:
        return controller.open(url, new=2)
    except (webbrowser.Error, OSError):
        return False
