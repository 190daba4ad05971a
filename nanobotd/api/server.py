"""The control API server: uvicorn serving the starlette app over a private Unix socket, on the daemon's loop.

Owns what uvicorn does not: the socket's folder and modes, the lock and stale-socket takeover, and a protocol that
checks peer credentials, gives a stalled request head its deadline, and answers what h11 refuses in our JSON error
shape. Nothing a client sends can stop the server short of stop()."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterable
from http import HTTPStatus
from pathlib import Path
from typing import Any, NamedTuple

import uvicorn
from loguru import logger
from uvicorn.protocols.http.h11_impl import H11Protocol

from nanobotd import fsio
from nanobotd.api.app import ApiError, Routes, build_app, encode
from nanobotd.tuning import BACKLOG, MAX_HEAD_BYTES, READ_TIMEOUT_SECONDS, STOP_GRACE_SECONDS

PROBE_TIMEOUT_SECONDS = 2.0
SOCKET_MODE = 0o600
DIR_MODE = 0o700
GROUP_SOCKET_MODE = 0o660  # with daemon.socket_group: the group may connect
GROUP_DIR_MODE = 0o710  # ... and pass through the directory, not list it
LOCK_SUFFIX = ".lock"
OWN_ENTRY_SUFFIXES = ("", LOCK_SUFFIX)
UCRED = struct.Struct("3i")


class PeerCredentials(NamedTuple):
    """pid, uid and gid of the peer process."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: Any) -> PeerCredentials | None:
    """The peer's credentials as the kernel saw them at connect() (for a server: at listen()), so a peer cannot
    fake them and they name the pid of a daemon already listening; None when the socket cannot tell."""
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    except (OSError, AttributeError):
        return None
    if len(raw) != UCRED.size:
        return None
    return PeerCredentials(*UCRED.unpack(raw))


def peer_groups(pid: int) -> set[int]:
    """The peer process's primary and supplementary group ids (from /proc); empty when unreadable. SO_PEERCRED names
    only the primary gid, so a peer allowed through a supplementary group is found here."""
    groups: set[int] = set()
    try:
        with open(f"/proc/{int(pid)}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name == "Groups":
                    groups.update(int(item) for item in value.split() if item.isdigit())
                elif name == "Gid":
                    groups.update(int(item) for item in value.split()[:1] if item.isdigit())
    except (OSError, ValueError):
        return set()
    return groups


class ControlSocketError(RuntimeError):
    """The control socket cannot be set up safely: untrusted directory, path taken, bind failure."""


class SocketInUse(ControlSocketError):
    """Another live daemon already serves this socket path; this one must exit."""


class ControlServer:
    """Serves *routes* on a 0600 Unix socket inside a 0700 directory, for our own uid and root only."""

    def __init__(self, socket_path: Path, routes: Routes, *, allowed_uids: Iterable[int] | None = None,
                 socket_gid: int | None = None, read_timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.socket_path = Path(socket_path)
        self.routes = list(routes)
        self.allowed_uids = frozenset({os.geteuid(), 0} if allowed_uids is None else allowed_uids)
        self.socket_gid = socket_gid
        self.read_timeout = read_timeout
        self._server: uvicorn.Server | None = None
        self._lock = contextlib.ExitStack()
        self._socket_identity: tuple[int, int] | None = None

    @property
    def listening(self) -> bool:
        """True while the socket accepts connections."""
        return self._server is not None and all(server.is_serving() for server in self._server.servers)

    async def start(self) -> None:
        """Secure the directory, take over a stale socket file, bind and listen; SocketInUse if taken."""
        if self._server is not None:
            return
        ensure_private_dir(self.socket_path.parent, own_name=self.socket_path.name, group=self.socket_gid)
        self._take_lock()
        try:
            await self._clear_stale_socket()
            sock = _bind_socket(self.socket_path, group=self.socket_gid)
            info = os.stat(self.socket_path)
            self._socket_identity = (info.st_dev, info.st_ino)
            config = uvicorn.Config(build_app(self.routes, read_timeout=self.read_timeout), lifespan="off",
                                    http=functools.partial(PeerProtocol, control=self), ws="none",
                                    log_config=None, log_level="warning", access_log=False, proxy_headers=False,
                                    server_header=False, date_header=False, backlog=BACKLOG,
                                    h11_max_incomplete_event_size=MAX_HEAD_BYTES)
            config.load()
            server = uvicorn.Server(config)
            server.lifespan = config.lifespan_class(config)
            await server.startup(sockets=[sock])  # not serve(): the daemon's own signal handlers stay
            self._server = server
        except BaseException:
            self._lock.close()
            raise
        logger.info("control API listening on {}", self.socket_path)

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop accepting, give open requests *grace* seconds, then remove the socket file we created."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.config.timeout_graceful_shutdown = grace
        await server.shutdown()
        self._remove_own_socket()
        self._lock.close()

    def allowed(self, credentials: PeerCredentials | None) -> bool:
        """The daemon's uid or root; with a socket group, also any process in it (primary or supplementary)."""
        if credentials is None:
            return False
        if credentials.uid in self.allowed_uids:
            return True
        if self.socket_gid is None:
            return False
        return credentials.gid == self.socket_gid or self.socket_gid in peer_groups(credentials.pid)

    def _take_lock(self) -> None:
        # The lock closes the race where two daemons starting together both find the same stale socket.
        lock_path = self.socket_path.with_name(self.socket_path.name + LOCK_SUFFIX)
        try:
            fd = self._lock.enter_context(fsio.file_lock(lock_path, timeout=0))
        except fsio.LockTimeout:
            pid = _read_pid(lock_path)
            raise SocketInUse(f"another nanobotd is already listening on {self.socket_path} "
                              f"(pid {pid or 'unknown'}, holding {lock_path.name})") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    async def _clear_stale_socket(self) -> None:
        try:
            info = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise ControlSocketError(f"{self.socket_path} exists and is not a socket; remove it or set another "
                                     "[daemon] socket")
        answered, pid = await _probe_listener(self.socket_path)
        if answered:
            raise SocketInUse(f"another nanobotd is already listening on {self.socket_path} "
                              f"(pid {pid or 'unknown'})")
        logger.info("replacing stale control socket {} (nothing answers on it)", self.socket_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _remove_own_socket(self) -> None:
        # Only the file we bound: a newer daemon may have replaced it after we stopped answering.
        try:
            info = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if (info.st_dev, info.st_ino) == self._socket_identity:
            os.unlink(self.socket_path)

class PeerProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, plus the peer check once per connection, a deadline for a request that never
    arrives whole, and the API's JSON error for a request h11 refuses (uvicorn answers those in plain text)."""

    def __init__(self, *args, control: ControlServer, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.control = control
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        credentials = peer_credentials(transport.get_extra_info("socket"))
        if not self.control.allowed(credentials):
            logger.warning("refused a control request from uid {} (pid {})",
                           getattr(credentials, "uid", "unknown"), getattr(credentials, "pid", "unknown"))
            self.app = self.forbidden
        self.deadline = self.loop.call_later(self.control.read_timeout, self.head_overdue)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        super().connection_lost(exc)

    def head_overdue(self) -> None:
        """No request head yet (a body that stalls is the app's to time out)."""
        if self.cycle is None and not self.transport.is_closing():
            self.send_error(408, "request_timeout", f"request not received within {self.control.read_timeout:g}s")

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside its `except h11.RemoteProtocolError`, whose hint says 431 for a head too large.
        error = sys.exc_info()[1]
        if getattr(error, "error_status_hint", 400) == 431:
            self.send_error(431, "headers_too_large", f"request head over {MAX_HEAD_BYTES} bytes")
        else:
            self.send_error(400, "bad_request", f"malformed request: {error or msg}")

    def send_error(self, status: int, code: str, message: str) -> None:
        """One JSON error written straight to the transport, which then closes."""
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        self.transport.write(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        self.transport.close()

    async def forbidden(self, scope, receive, send) -> None:
        """The ASGI app a peer that is not allowed gets: 403, its request unread."""
        who = "the daemon's own user, root" + (" and the socket group" if self.control.socket_gid is not None else "")
        await encode(ApiError(403, "forbidden", f"only {who} may use this socket").to_response())(scope, receive, send)

def ensure_private_dir(directory: Path, *, own_name: str = "", group: int | None = None) -> None:
    """Make *directory* a 0700 directory of ours (0710 of *group*); refuse another uid's or a shared one. A looser one
    of ours is tightened only if it holds just our socket files: a socket set in /run or /tmp changes no shared mode."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)
        info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise ControlSocketError(f"socket directory {directory} is not a directory (or is a symlink)")
    if info.st_uid != os.geteuid():
        raise ControlSocketError(f"socket directory {directory} is owned by uid {info.st_uid}, not by this "
                                 f"daemon's uid {os.geteuid()}; refusing to listen there")
    wanted = DIR_MODE if group is None else GROUP_DIR_MODE
    if group is not None and info.st_gid != group:
        os.chown(directory, -1, group)
    mode = stat.S_IMODE(info.st_mode)
    if mode == wanted:
        return
    own_entries = {own_name + suffix for suffix in OWN_ENTRY_SUFFIXES}
    foreign = [name for name in os.listdir(directory) if name not in own_entries]
    if foreign:
        raise ControlSocketError(f"socket directory {directory} has mode {mode:04o} and holds other files; "
                                 f"put the socket in a private directory (e.g. {directory / 'nanobotd'}/)")
    os.chmod(directory, wanted)
    logger.warning("set socket directory {} from {:04o} to {:04o}", directory, mode, wanted)


def _bind_socket(path: Path, *, group: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The socket node is created under this umask, so it is never reachable with group/other bits.
    previous_umask = os.umask(0o077)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SocketInUse(f"another process bound {path} while nanobotd was starting") from None
        raise ControlSocketError(f"cannot bind the control socket {path}: {exc}") from None
    finally:
        os.umask(previous_umask)
    if group is not None:
        os.chown(path, -1, group)
    os.chmod(path, SOCKET_MODE if group is None else GROUP_SOCKET_MODE)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


async def _probe_listener(path: Path) -> tuple[bool, int | None]:
    """Whether something answers on *path*, and its pid when it can be learned."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            _, writer = await asyncio.open_unix_connection(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False, None
    except TimeoutError:
        return True, None  # a listener too busy to accept is still alive
    except OSError as exc:
        raise ControlSocketError(f"cannot check whether {path} is in use: {exc}") from None
    credentials = peer_credentials(writer.get_extra_info("socket"))
    writer.close()
    return True, credentials.pid if credentials is not None and credentials.pid > 0 else None


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
