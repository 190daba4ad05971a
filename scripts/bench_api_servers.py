"""Candidate HTTP servers for the control API, one route over a Unix socket: start time and idle RSS.

    .venv/bin/python scripts/bench_api_servers.py [--runs 5]

For each server (nanobotd.api's own ControlServer, aiohttp's UnixSite, bare uvicorn + starlette) five
cold processes each import the server, bind a socket and answer GET /v1/status with the peer's uid; printed:
the median time from process start to the first answer, the median import + bind time inside the process,
the process's RSS once idle after 20 requests, and what importing the server adds on top of the daemon's own
imports (time and RSS; 0 for a server the daemon already imports).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SERVE = {
    "nanobotd.api": r'''
import asyncio, os, time
t0 = time.perf_counter()
from nanobotd.api.server import ControlServer
async def status(request):
    return {"uid": os.geteuid()}  # answered only to a peer whose SO_PEERCRED uid passed
async def main():
    server = ControlServer(PATH, [("GET", "/v1/status", status)])
    await server.start()
    print(time.perf_counter() - t0, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
''',
    "aiohttp": r'''
import asyncio, os, socket, struct, time
t0 = time.perf_counter()
from aiohttp import web
async def status(request):
    sock = request.transport.get_extra_info("socket")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return web.json_response({"uid": uid})
async def main():
    app = web.Application()
    app.router.add_get("/v1/status", status)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.UnixSite(runner, PATH).start()
    print(time.perf_counter() - t0, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
''',
    "uvicorn+starlette": r'''
import asyncio, os, socket, struct, time
t0 = time.perf_counter()
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
class PeerProtocol(H11Protocol):
    # uvicorn hands an app no socket: the protocol reads the peer's credentials and passes them in the scope
    def connection_made(self, transport):
        sock = transport.get_extra_info("socket")
        self.peer = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        app = self.app
        async def with_peer(scope, receive, send):
            scope.setdefault("state", {})["peer"] = self.peer
            await app(scope, receive, send)
        self.app = with_peer
        super().connection_made(transport)
async def status(request):
    return JSONResponse({"uid": request.scope["state"]["peer"][1]})
async def main():
    app = Starlette(routes=[Route("/v1/status", status)])
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(PATH)
    sock.listen(1024)
    server = uvicorn.Server(uvicorn.Config(app, http=PeerProtocol, lifespan="off", log_config=None,
                                           access_log=False))
    server.config.load()
    server.lifespan = server.config.lifespan_class(server.config)
    await server.startup(sockets=[sock])
    print(time.perf_counter() - t0, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
''',
}

IMPORTS = {
    "nanobotd.api": "import nanobotd.api.server",
    "aiohttp": "import aiohttp.web",
    "uvicorn+starlette": "import uvicorn, uvicorn.protocols.http.h11_impl, starlette.applications, starlette.routing",
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def get_status(path: str) -> dict:
    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)

    connection = UnixConnection("nanobotd", timeout=5)
    try:
        connection.request("GET", "/v1/status", headers={"Connection": "close"})
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def one_cold_start(name: str) -> tuple[float, float, float]:
    """Wall seconds from spawn to first answer, in-process import + bind seconds, idle RSS (MB)."""
    folder = tempfile.mkdtemp(prefix="nbs-", dir="/tmp")
    path = os.path.join(folder, "run", "s.sock")
    os.makedirs(os.path.dirname(path), mode=0o700)
    code = f"PATH = {path!r}\n" + SERVE[name]
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        inside = float(child.stdout.readline())
        assert get_status(path)["uid"] == os.geteuid()
        wall = time.perf_counter() - started
        for _ in range(20):
            get_status(path)
        time.sleep(0.5)
        return wall, inside, rss_mb(child.pid)
    finally:
        child.kill()
        child.wait()


def import_cost(name: str) -> tuple[float, float]:
    """Seconds and MB of RSS that importing *name* adds to a process that already imported the daemon."""
    code = ("import time, resource\n"
            "import nanobotd.daemon.daemon, nanobotd.cli.nanobotd\n"
            "def rss():\n"
            "    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize() / 2**20\n"
            f"before = rss(); t = time.perf_counter()\n{IMPORTS[name]}\n"
            "print(time.perf_counter() - t, rss() - before)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO))).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'server':<20} {'spawn->answer':>14} {'import+bind':>12} {'idle RSS':>9} {'+daemon import':>15} "
          f"{'+daemon RSS':>12}")
    for name in SERVE:
        starts = [one_cold_start(name) for _ in range(args.runs)]
        costs = [import_cost(name) for _ in range(args.runs)]
        print(f"{name:<20} {statistics.median(s[0] for s in starts) * 1000:>11.0f} ms "
              f"{statistics.median(s[1] for s in starts) * 1000:>9.0f} ms "
              f"{statistics.median(s[2] for s in starts):>6.1f} MB "
              f"{statistics.median(c[0] for c in costs) * 1000:>12.0f} ms "
              f"{statistics.median(c[1] for c in costs):>9.1f} MB")


if __name__ == "__main__":
    main()
