"""The control-socket client: one JSON request per connection, errors turned into our own (standard library only)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from nanobotd.config import paths

DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
CONNECT_RETRY_FIRST_SECONDS = 0.005  # a full listen queue is tried again after this, then twice as long each time
CONNECT_RETRY_MAX_SECONDS = 0.1
START_HINT = ("Is nanobotd running? Start it with `nanobotd run --workspace DIR`, or as a service with "
              "`systemctl --user start nanobotd` (system-wide: `systemctl start nanobotd`). "
              "Use --socket PATH if it listens elsewhere.")
PERMISSION_HINT = "The daemon runs as another user: run nanobotctl as that user or as root."
UNTRUSTED_HINT = ("Another user can put a server there. Remove that folder if it is not yours, or give the daemon "
                  "and nanobotctl a private socket folder (XDG_RUNTIME_DIR, or [daemon] socket / --socket).")
SYSTEM_UID_MAX = 999  # a service account (the system unit's `nanobotd` user): only root can give a folder to one


class CannotConnect(Exception):
    """Nothing answers on the control socket (or we may not use it); hint says what to do."""

    def __init__(self, message: str, hint: str = START_HINT) -> None:
        super().__init__(message)
        self.hint = hint


class DaemonError(Exception):
    """The daemon answered with an error, or with something that is not its API."""

    def __init__(self, message: str, status: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over an AF_UNIX stream socket, because the daemon listens on no TCP port."""

    def __init__(self, socket_path: Path, timeout: float) -> None:
        super().__init__("nanobotd", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        """Connect to the socket path, waiting out a full listen queue (EAGAIN: a Unix socket does not wait itself)."""
        deadline = time.monotonic() + self.timeout
        pause = CONNECT_RETRY_FIRST_SECONDS
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.socket_path))
            except BlockingIOError:
                sock.close()
                if time.monotonic() + pause > deadline:
                    raise TimeoutError(f"the daemon's listen queue stayed full for {self.timeout:g}s") from None
                time.sleep(pause)
                pause = min(pause * 2, CONNECT_RETRY_MAX_SECONDS)
                continue
            except BaseException:
                sock.close()
                raise
            self.sock = sock
            return


class Client:
    """One HTTP request per connection to the daemon, JSON in and out; the workspace rides along."""

    def __init__(self, socket_path: Path, timeout: float, workspace: str | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.workspace = workspace

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> dict:
        """GET *path* with the non-empty *query* values (plus the workspace, when one was chosen)."""
        query = {name: value for name, value in (query or {}).items() if value not in (None, "")}
        if self.workspace:
            query.setdefault("workspace", self.workspace)
        if query:
            query = {name: str(value).lower() if isinstance(value, bool) else value for name, value in query.items()}
            path = f"{path}?{urlencode(query)}"
        return self.request("GET", path)

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> dict:
        """POST a JSON *body* (plus the workspace, when one was chosen)."""
        body = dict(body or {})
        if self.workspace:
            body.setdefault("workspace", self.workspace)
        return self.request("POST", path, body)

    def request(self, method: str, path: str, body: Any = None) -> dict:
        """Send one request; CannotConnect when nobody listens, DaemonError on an error answer."""
        status, raw = self._send(method, path, body)
        payload = _answer(status, raw)
        if not isinstance(payload, dict):
            raise DaemonError("the daemon's answer is not a JSON object", status)
        return payload

    def text(self, path: str) -> str:
        """GET *path* whose answer is text, not JSON (the Prometheus figures of /metrics)."""
        status, raw = self._send("GET", path, None)
        if status >= 400:
            _answer(status, raw)
        return raw.decode("utf-8", errors="replace")

    def _send(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        check_socket_folder(self.socket_path)
        connection = UnixHTTPConnection(self.socket_path, self.timeout)
        headers = {"Accept": "application/json", "Connection": "close"}
        if body is not None:
            body = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            try:
                connection.connect()
            except (OSError, TimeoutError) as exc:
                raise CannotConnect(f"cannot connect to nanobotd at {self.socket_path}: {exc.strerror or exc}",
                                    PERMISSION_HINT if isinstance(exc, PermissionError) else START_HINT) from None
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read(MAX_RESPONSE_BYTES)
        except TimeoutError:
            raise DaemonError(f"nanobotd did not answer within {self.timeout:g}s (try --timeout)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise DaemonError(f"connection to nanobotd lost: {exc}") from None
        finally:
            connection.close()


def check_socket_folder(socket_path: Path) -> None:
    """CannotConnect unless *socket_path*'s folder is trusted (owned by us, root or a service account serving us,
    writable by no one else): anyone may make /tmp/nanobotd-<uid>/ first, and what answers would pass for memory."""
    folder = socket_path.parent
    try:
        link = os.lstat(folder)
        info = os.stat(folder)
    except OSError:
        return  # nothing there: connecting says so
    for what, node in (("folder", info), ("symlink to the folder", link)):
        if node is link and not stat.S_ISLNK(link.st_mode):
            continue
        if not _trusted_owner(node):
            raise CannotConnect(f"refusing the socket {socket_path}: its {what} {folder} belongs to uid "
                                f"{node.st_uid}, not to you (uid {os.geteuid()}) or root", UNTRUSTED_HINT)
    if stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
        raise CannotConnect(f"refusing the socket {socket_path}: its folder {folder} is writable by others "
                            f"(mode {stat.S_IMODE(info.st_mode):04o})", UNTRUSTED_HINT)


def _trusted_owner(info: os.stat_result) -> bool:
    """Us, root, or a service account (no ordinary user can give it a folder) serving us: we are root, or the
    folder is in one of our groups (daemon.socket_group)."""
    if info.st_uid in (os.geteuid(), 0):
        return True
    if info.st_uid > SYSTEM_UID_MAX:
        return False
    return os.geteuid() == 0 or info.st_gid in (*os.getgroups(), os.getegid())


def resolve_socket(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    """--socket, else $NANOBOTD_SOCKET, else the config's [daemon] socket, else the default path."""
    if args.socket:
        return Path(args.socket).expanduser()
    if environ.get("NANOBOTD_SOCKET"):
        return Path(environ["NANOBOTD_SOCKET"]).expanduser()
    config_path = Path(args.config).expanduser() if args.config else paths.default_config_path(environ)
    return paths.socket_from_config(config_path) or paths.default_socket_path(environ)


def _answer(status: int, raw: bytes) -> Any:
    """The JSON of an answer; DaemonError for an error answer (its message) or one that is not JSON."""
    try:
        payload = json.loads(raw) if raw else {}
    except ValueError:
        raise DaemonError(f"the daemon's answer (HTTP {status}) is not JSON", status) from None
    if status < 400:
        return payload
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        raise DaemonError(f"daemon answered HTTP {status}", status)
    raise DaemonError(str(error.get("message") or error.get("code") or f"HTTP {status}"), status,
                      str(error.get("code", "")))

