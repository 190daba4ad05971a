"""The control API server over real Unix sockets in private tmp directories."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from nanobotd.api.app import ApiError, Request, Response
from nanobotd.api.server import ControlServer, ControlSocketError, SocketInUse, ensure_private_dir
from nanobotd.tuning import MAX_BODY_BYTES

OTHER_UID = 65534  # "nobody"
GET_STATUS = b"GET /v1/status HTTP/1.1\r\nHost: nanobotd\r\n\r\n"


class ServerThread:
    """Runs a ControlServer on its own event loop in a thread, so tests can use blocking clients."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coroutine, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        try:
            self.call(self.server.start())
        except BaseException:
            self._close_loop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.call(self.server.stop())
        self._close_loop()

    def _close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def socket_dir():
    # AF_UNIX paths are limited to 107 bytes, too short for pytest's tmp_path under long test names.
    base = Path(tempfile.mkdtemp(prefix="nbd-", dir="/tmp"))
    yield base / "run"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def socket_path(socket_dir: Path) -> Path:
    return socket_dir / "nanobotd.sock"


def sample_router(calls: list | None = None) -> list:
    calls = [] if calls is None else calls

    async def status(request: Request) -> dict:
        calls.append(request)
        return {"pid": os.getpid(), "query": request.query}

    async def session(request: Request) -> dict:
        calls.append(request)
        return {"key": request.params["key"]}

    async def consolidate(request: Request) -> Response:
        calls.append(request)
        return Response(202, {"run_id": "r1", "session": request.body_value("session", str)})

    async def runs(request: Request) -> dict:
        return {"limit": request.query_int("limit", 20, minimum=1, maximum=100)}

    async def boom(request: Request) -> dict:
        raise RuntimeError("handler exploded")

    async def missing(request: Request) -> dict:
        raise ApiError(404, "unknown_session", f"no session {request.params['key']}")

    async def not_json(request: Request) -> dict:
        return {"value": object()}

    async def text(request: Request) -> Response:
        return Response(200, "# HELP up Whether it is up.\nup 1\n", content_type="text/plain; version=0.0.4")

    return [("GET", "/v1/status", status), ("GET", "/v1/sessions/{key:path}", session),
            ("POST", "/v1/consolidate", consolidate), ("GET", "/v1/runs", runs), ("GET", "/v1/boom", boom),
            ("GET", "/v1/missing/{key}", missing), ("GET", "/v1/not-json", not_json), ("GET", "/metrics", text)]


def exchange(path: Path, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        client.connect(str(path))
        client.sendall(data)
        return read_all(client)


def read_all(client: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = client.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], dict | None]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return status, headers, json.loads(body) if body else None


def request(path: Path, method: str, target: str, body: bytes | None = None) -> tuple[int, dict, dict | None]:
    head = f"{method} {target} HTTP/1.1\r\nHost: nanobotd\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return parse_response(exchange(path, (head + "\r\n").encode() + (body or b"")))


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_socket_is_0600_inside_a_created_0700_directory(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())) as running:
        assert running.server.listening
        assert mode_of(socket_path.parent) == 0o700
        assert mode_of(socket_path) == 0o600
        assert stat.S_ISSOCK(os.lstat(socket_path).st_mode)


def test_a_looser_directory_of_ours_is_tightened(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o755)
    os.chmod(socket_path.parent, 0o755)
    with ServerThread(ControlServer(socket_path, sample_router())):
        assert mode_of(socket_path.parent) == 0o700


def test_a_directory_owned_by_another_uid_is_refused(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o700)
    os.chown(socket_path.parent, OTHER_UID, OTHER_UID)
    with pytest.raises(ControlSocketError, match=f"owned by uid {OTHER_UID}"):
        ensure_private_dir(socket_path.parent, own_name=socket_path.name)


def test_a_shared_directory_is_refused_rather_than_chmodded(socket_path: Path) -> None:
    socket_path.parent.mkdir()
    os.chmod(socket_path.parent, 0o755)
    (socket_path.parent / "someone-elses-file").write_text("x")
    with pytest.raises(ControlSocketError, match="private directory"):
        ensure_private_dir(socket_path.parent, own_name=socket_path.name)
    assert mode_of(socket_path.parent) == 0o755


def test_a_symlinked_directory_is_refused(socket_path: Path) -> None:
    real = socket_path.parent.with_name("real")
    real.mkdir(mode=0o700)
    socket_path.parent.symlink_to(real)
    with pytest.raises(ControlSocketError, match="symlink"):
        ensure_private_dir(socket_path.parent)


def test_get_passes_decoded_path_params_and_query(socket_path: Path) -> None:
    calls: list[Request] = []
    with ServerThread(ControlServer(socket_path, sample_router(calls))):
        status, _, body = request(socket_path, "GET", "/v1/sessions/telegram%3A42%2Fthread%20one?x=1&empty=")
        assert status == 200
        assert body == {"key": "telegram:42/thread one"}
        status, _, body = request(socket_path, "GET", "/v1/status?workspace=main&q=a+b%26c")
        assert body["query"] == {"workspace": "main", "q": "a b&c"}
    assert calls[0].method == "GET"
    assert calls[0].path == "/v1/sessions/telegram%3A42%2Fthread%20one"
    assert calls[0].query == {"x": "1", "empty": ""}


def test_a_text_body_with_its_content_type_goes_on_the_wire_as_it_is(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        head, _, body = exchange(socket_path, b"GET /metrics HTTP/1.1\r\nHost: nanobotd\r\n\r\n").partition(b"\r\n\r\n")
        assert b"content-type: text/plain; version=0.0.4\r\n" in head.lower()
        assert body == b"# HELP up Whether it is up.\nup 1\n"
        assert request(socket_path, "GET", "/v1/status")[1]["content-type"] == "application/json"


def test_post_with_json_body_and_explicit_status(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = request(socket_path, "POST", "/v1/consolidate", json.dumps({"session": "cli:x"}).encode())
    assert status == 202
    assert body == {"run_id": "r1", "session": "cli:x"}


def test_unknown_path_is_404_and_wrong_method_is_405(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = request(socket_path, "GET", "/v1/nothing")
        assert status == 404
        assert body["error"]["code"] == "not_found"
        status, headers, body = request(socket_path, "DELETE", "/v1/status")
        assert status == 405
        assert body["error"]["code"] == "method_not_allowed"
        assert set(headers["allow"].split(", ")) == {"GET", "HEAD"}
        status, _, body = request(socket_path, "GET", "/v1/sessions/")
        assert status == 404


def test_handler_api_error_becomes_the_error_body(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = request(socket_path, "GET", "/v1/missing/abc")
    assert status == 404
    assert body == {"error": {"code": "unknown_session", "message": "no session abc"}}


def test_malformed_json_and_bad_params_are_400(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = request(socket_path, "POST", "/v1/consolidate", b'{"session": ')
        assert (status, body["error"]["code"]) == (400, "bad_json")
        status, _, body = request(socket_path, "POST", "/v1/consolidate", b"[" * 100_000)
        assert (status, body["error"]["code"]) == (400, "bad_json")
        status, _, body = request(socket_path, "POST", "/v1/consolidate", b'{"session": 5}')
        assert (status, body["error"]["code"]) == (400, "bad_param")
        assert "session" in body["error"]["message"]
        status, _, body = request(socket_path, "POST", "/v1/consolidate", b'["not", "an", "object"]')
        assert status == 400
        status, _, body = request(socket_path, "GET", "/v1/runs?limit=lots")
        assert (status, body["error"]["code"]) == (400, "bad_param")
        status, _, body = request(socket_path, "GET", "/v1/runs?limit=1000")
        assert status == 400
        status, _, body = request(socket_path, "GET", "/v1/runs?limit=")
        assert body == {"limit": 20}


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /v1/status\r\n\r\n",
    b"GET v1/status HTTP/1.1\r\nHost: nanobotd\r\n\r\n",
    b"GET /v1/status HTTP/3.0\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nHost: nanobotd\r\nno colon here\r\n\r\n",
    b"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nContent-Length: -5\r\n\r\n",
    b"GET /v1/sessions/%FF%FE HTTP/1.1\r\nHost: nanobotd\r\n\r\n",
])
def test_malformed_requests_are_400(socket_path: Path, raw: bytes) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = parse_response(exchange(socket_path, raw))
    assert status == 400
    assert body["error"]["code"] == "bad_request"


def test_an_oversized_request_head_is_431(socket_path: Path) -> None:
    raw = b"GET /v1/status HTTP/1.1\r\nHost: nanobotd\r\n" + b"X-Filler: " + b"a" * 70_000 + b"\r\n\r\n"
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = parse_response(exchange(socket_path, raw))
    assert (status, body["error"]["code"]) == (431, "headers_too_large")


def test_expect_100_continue_is_answered_before_the_body(socket_path: Path) -> None:
    payload = json.dumps({"session": "s" * 2000}).encode()
    head = (f"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nExpect: 100-continue\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")
    with ServerThread(ControlServer(socket_path, sample_router())):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(head.encode())
            assert client.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            client.sendall(payload)
            status, _, _ = parse_response(read_all(client))
    assert status == 202


def test_chunked_bodies_are_refused_with_411(socket_path: Path) -> None:
    raw = (b"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n0\r\n\r\n")
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = parse_response(exchange(socket_path, raw))
    assert (status, body["error"]["code"]) == (411, "length_required")


def test_an_oversized_body_is_refused_before_it_is_sent(socket_path: Path) -> None:
    calls: list[Request] = []
    head = f"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nContent-Length: {2 * 1024 * 1024}\r\n\r\n".encode()
    with ServerThread(ControlServer(socket_path, sample_router(calls))):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(head)  # the answer comes although not one byte of the body was sent
            status, _, body = parse_response(read_all(client))
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"
    assert calls == []


def test_a_two_megabyte_body_gets_413_and_the_server_goes_on(socket_path: Path) -> None:
    payload = b'{"session": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    head = f"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
    with ServerThread(ControlServer(socket_path, sample_router())):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(head)
            try:
                client.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server closed without reading the body, as it should
            status, _, _ = parse_response(read_all(client))
        assert status == 413
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def test_a_body_at_the_limit_is_accepted(socket_path: Path) -> None:
    padding = MAX_BODY_BYTES - len(b'{"session": "", "pad": ""}') - 1
    payload = json.dumps({"session": "s", "pad": "p" * padding}).encode()
    assert len(payload) <= MAX_BODY_BYTES
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, _ = request(socket_path, "POST", "/v1/consolidate", payload)
    assert status == 202


def test_a_client_stalling_mid_request_gets_408(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router(), read_timeout=0.3)):
        started = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(b"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nContent-Length: 100\r\n\r\n{\"sess")
            status, _, body = parse_response(read_all(client))
        assert (status, body["error"]["code"]) == (408, "request_timeout")
        assert time.monotonic() - started < 3
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def test_a_handler_exception_is_500_and_the_next_request_works(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        status, _, body = request(socket_path, "GET", "/v1/boom")
        assert status == 500
        assert body["error"]["code"] == "internal"
        assert "handler exploded" in body["error"]["message"]
        status, _, body = request(socket_path, "GET", "/v1/not-json")
        assert status == 500
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def test_clients_that_hang_up_early_do_not_disturb_the_server(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        for data in (b"", b"GET /v1/sta",
                     b"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nContent-Length: 50\r\n\r\n{"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(socket_path))
                client.sendall(data)
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def test_a_stale_socket_file_is_replaced(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o700)
    crashed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    crashed.bind(str(socket_path))
    crashed.close()  # the file stays behind, as after a crash
    with ServerThread(ControlServer(socket_path, sample_router())):
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def test_a_live_listener_raises_socket_in_use_naming_its_pid(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(socket_path))
        other.listen(1)
        with pytest.raises(SocketInUse, match=f"already listening on {socket_path} \\(pid {os.getpid()}\\)"):
            ServerThread(ControlServer(socket_path, sample_router())).__enter__()
        assert socket_path.exists()


def test_a_second_daemon_on_the_same_socket_raises_socket_in_use(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        with pytest.raises(SocketInUse, match=f"pid {os.getpid()}"):
            ServerThread(ControlServer(socket_path, sample_router())).__enter__()
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def test_a_regular_file_at_the_socket_path_is_left_alone(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o700)
    socket_path.write_text("not a socket")
    with pytest.raises(ControlSocketError, match="not a socket"):
        ServerThread(ControlServer(socket_path, sample_router())).__enter__()
    assert socket_path.read_text() == "not a socket"


def test_stop_waits_its_grace_for_a_request_in_progress_then_answers_it_503(socket_path: Path) -> None:
    server = ControlServer(socket_path, sample_router())
    with ServerThread(server) as running:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(b"POST /v1/consolidate HTTP/1.1\r\nHost: nanobotd\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.2)
            started = time.monotonic()
            running.call(server.stop(grace=0.5))
            assert time.monotonic() - started < 3
            status, _, body = parse_response(read_all(client))
    assert (status, body["error"]["code"]) == (503, "stopping")
    assert not socket_path.exists()


def test_stop_removes_the_socket_and_a_restart_works(socket_path: Path) -> None:
    server = ControlServer(socket_path, sample_router())
    with ServerThread(server):
        assert server.listening
    assert not server.listening
    assert not socket_path.exists()
    with ServerThread(ControlServer(socket_path, sample_router())):
        assert request(socket_path, "GET", "/v1/status")[0] == 200


def run_as_other_uid(socket_path: Path, raw: bytes, groups: list[int] | None = None) -> bytes:
    """Fork a child that drops to uid 65534 (with supplementary *groups*) before connecting; return what it read."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only raw syscalls, then _exit, so nothing of pytest runs twice
        try:
            os.close(reader)
            os.setgroups(groups or [])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.settimeout(5)
                    client.connect(str(socket_path))
                    client.sendall(raw)
                    result = read_all(client)
            except OSError as exc:
                result = f"ERROR {type(exc).__name__}".encode()
            os.write(writer, result)
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        result = pipe.read()
    os.waitpid(pid, 0)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_a_client_running_as_another_uid_gets_403(socket_path: Path) -> None:
    """The 0600/0700 modes alone stop uid 65534 at connect(); to exercise the SO_PEERCRED check itself
    this test opens the directory and socket up after start(), as a misconfiguration would."""
    calls: list[Request] = []
    with ServerThread(ControlServer(socket_path, sample_router(calls))):
        os.chmod(socket_path.parent.parent, 0o711)
        os.chmod(socket_path.parent, 0o711)
        os.chmod(socket_path, 0o666)
        status, _, body = parse_response(run_as_other_uid(socket_path, GET_STATUS))
        assert status == 403
        assert body["error"]["code"] == "forbidden"
        assert calls == []
        assert request(socket_path, "GET", "/v1/status")[0] == 200


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_the_private_modes_keep_another_uid_from_connecting_at_all(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        os.chmod(socket_path.parent.parent, 0o711)  # only the 0700 socket directory stands in the way
        assert run_as_other_uid(socket_path, GET_STATUS) == b"ERROR PermissionError"


def test_a_uid_outside_the_allowed_set_is_forbidden(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router(), allowed_uids={os.geteuid() + 4242})):
        status, _, body = request(socket_path, "GET", "/v1/status")
    assert (status, body["error"]["code"]) == (403, "forbidden")


SOCKET_GID = 47111  # any gid works: the kernel and /proc know it without /etc/group


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid with chosen groups")
def test_a_peer_in_the_socket_group_is_allowed_and_one_outside_it_is_refused(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router(), socket_gid=SOCKET_GID)):
        os.chmod(socket_path.parent.parent, 0o711)  # the test's own tmp folders; the socket folder is 0710
        info, folder = os.stat(socket_path), os.stat(socket_path.parent)
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o660, SOCKET_GID)
        assert (stat.S_IMODE(folder.st_mode), folder.st_gid) == (0o710, SOCKET_GID)
        member = parse_response(run_as_other_uid(socket_path, GET_STATUS,
                                                    [SOCKET_GID]))
        assert member[0] == 200
        # outside the group the modes already stop it; opened up, the peer check still refuses it
        assert run_as_other_uid(socket_path, GET_STATUS, []) == b"ERROR PermissionError"
        os.chmod(socket_path.parent, 0o711)
        os.chmod(socket_path, 0o666)
        outsider = parse_response(run_as_other_uid(socket_path, GET_STATUS, [4242]))
        assert (outsider[0], outsider[2]["error"]["code"]) == (403, "forbidden")


def test_a_client_stalling_in_its_request_head_gets_408_and_others_are_served_meanwhile(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router(), read_timeout=1.0)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(b"GET /v1/status HTTP/1.1\r\nHost: nano")
            assert request(socket_path, "GET", "/v1/status")[0] == 200
            status, _, body = parse_response(read_all(client))
        assert (status, body["error"]["code"]) == (408, "request_timeout")


def test_a_thousand_connections_at_once_are_all_answered(socket_path: Path) -> None:
    with ServerThread(ControlServer(socket_path, sample_router())):
        clients = []
        try:
            for _ in range(1000):
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                clients.append(client)
                client.settimeout(30)
                client.connect(str(socket_path))
            for client in clients:
                client.sendall(GET_STATUS)
            answers = [parse_response(read_all(client))[0] for client in clients]
        finally:
            for client in clients:
                client.close()
    assert answers == [200] * 1000
