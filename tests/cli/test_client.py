"""nanobotd/cli/client.py: connecting, errors, the socket path and the workspace parameter."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from nanobotd.cli import client
from nanobotd.cli import nanobotctl as ctl
from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_a_daemon_error_exits_1_with_its_message(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, err = run_ctl(socket_path, "session", "nope")
    assert (code, out) == (1, "")
    assert err == "nanobotctl: no session 'nope' in workspace main\n"


def test_no_daemon_exits_2_with_a_hint_how_to_start_it(socket_path: Path) -> None:
    code, out, err = run_ctl(socket_path, "status")
    assert (code, out) == (2, "")
    assert f"cannot connect to nanobotd at {socket_path}" in err
    assert "nanobotd run --workspace DIR" in err
    assert "systemctl --user start nanobotd" in err


SERVICE_UID = 999  # the system unit's `nanobotd` user, owner of /run/nanobotd


def as_user(uid: int, groups: list[int], socket_path: Path) -> tuple[str, str]:
    """nanobotctl status run in a child as *uid* with *groups*: (exit code, stderr)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reader)
            os.setgroups(groups)
            os.setgid(uid)
            os.setuid(uid)
            code, _, err = run_ctl(socket_path, "status")
            os.write(writer, f"{code}\n{err}".encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        code, _, err = pipe.read().partition("\n")
    os.waitpid(pid, 0)
    return code, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_a_socket_of_another_user_gets_a_permission_hint(socket_path: Path, daemon: FakeDaemon) -> None:
    os.chmod(socket_path.parent.parent, 0o711)  # the daemon's 0700 directory is what refuses uid 65534
    code, err = as_user(65534, [], socket_path)
    assert code == "2"
    assert "Permission denied" in err
    assert "runs as another user" in err


def test_the_socket_comes_from_env_then_config_then_the_default(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[daemon]\nsocket = "/run/custom/nb.sock"\n')
    parse = ctl.build_parser().parse_args
    environ = {"NANOBOTD_SOCKET": "/tmp/env.sock", "XDG_RUNTIME_DIR": "/run/user/1000", "HOME": str(tmp_path)}
    assert client.resolve_socket(parse(["--socket", "/tmp/a.sock", "status"]), environ) == Path("/tmp/a.sock")
    assert client.resolve_socket(parse(["status"]), environ) == Path("/tmp/env.sock")
    del environ["NANOBOTD_SOCKET"]
    assert client.resolve_socket(parse(["--config", str(config), "status"]), environ) == Path("/run/custom/nb.sock")
    assert client.resolve_socket(parse(["status"]), environ) == Path("/run/user/1000/nanobotd/nanobotd.sock")


def test_workspace_is_sent_as_query_or_body_param(socket_path: Path, daemon: FakeDaemon) -> None:
    run_ctl(socket_path, "--workspace", "second", "sessions")
    assert daemon.requests[-1].query == {"workspace": "second"}
    run_ctl(socket_path, "dream", "--workspace", "second", "--no-wait")
    assert daemon.requests[-1].body == {"workspace": "second"}


def test_a_workspace_path_is_sent_absolute_because_the_daemon_runs_elsewhere(socket_path: Path, daemon: FakeDaemon,
                                                                           monkeypatch) -> None:
    monkeypatch.chdir(socket_path.parent)
    run_ctl(socket_path, "--workspace", "./ws", "runs")
    assert daemon.requests[-1].query == {"workspace": str(socket_path.parent / "ws")}
    run_ctl(socket_path, "--workspace", "~/ws/", "sessions")
    assert daemon.requests[-1].query == {"workspace": str(Path.home() / "ws")}


def test_a_full_listen_queue_is_waited_out_until_the_daemon_accepts(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(0)  # a daemon too busy to accept: its queue is full after one connection
    queued = []
    while True:  # fill the queue for real: the next connect gets EAGAIN
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(str(socket_path))
        except BlockingIOError:
            filler.close()
            break
        queued.append(filler)
    answers: list[object] = []
    asking = threading.Thread(target=lambda: answers.append(_status_or_error(socket_path)))
    asking.start()
    time.sleep(0.5)  # the client meets the full queue (not a timed assertion: it must wait however long this is)
    for filler in queued:
        filler.close()
    listener.settimeout(10)
    while asking.is_alive():
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(10)
            if connection.recv(65536):
                body = b'{"pid": 7}'
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                   + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                break
    asking.join(10)
    listener.close()
    assert answers == [{"pid": 7}]


def _status_or_error(socket_path: Path) -> object:
    try:
        return client.Client(socket_path, timeout=10).get("/v1/status")
    except (client.CannotConnect, client.DaemonError) as exc:
        return exc


IMPOSTOR_UID = 65534  # nobody: another user who made the socket's folder first


def test_a_socket_in_a_folder_of_another_user_is_refused_before_anything_is_sent(socket_path: Path,
                                                                                 daemon: FakeDaemon) -> None:
    os.chown(socket_path.parent, IMPOSTOR_UID, IMPOSTOR_UID)  # the impostor's folder, its server listening in it
    code, out, err = run_ctl(socket_path, "search", "where is the spare key")
    assert (code, out) == (2, "")
    assert f"belongs to uid {IMPOSTOR_UID}" in err and "Another user can put a server there" in err
    assert daemon.requests == []  # the query never reached it


def test_a_socket_in_a_folder_others_may_write_is_refused(socket_path: Path, daemon: FakeDaemon) -> None:
    os.chmod(socket_path.parent, 0o1777)  # a /tmp-like folder: anyone could have replaced the socket
    code, _, err = run_ctl(socket_path, "status")
    assert code == 2 and "writable by others (mode 1777)" in err
    assert daemon.requests == []
    os.chmod(socket_path.parent, 0o700)
    assert run_ctl(socket_path, "status")[0] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_a_service_accounts_socket_folder_is_trusted_by_root_and_by_its_socket_group(socket_path: Path,
                                                                                      daemon: FakeDaemon) -> None:
    os.chmod(socket_path.parent.parent, 0o711)  # (the test's own folder, above /run/nanobotd's stand-in)
    os.chown(socket_path.parent, SERVICE_UID, SERVICE_UID)
    os.chmod(socket_path.parent, 0o710)  # daemon.socket_group: the group may pass through
    os.chmod(socket_path, 0o666)  # (the canned daemon's own uid check answers the others)
    assert run_ctl(socket_path, "status")[0] == 0
    code, err = as_user(65534, [SERVICE_UID], socket_path)  # in the socket group: trusted, and answered
    assert "refusing" not in err and "only the daemon's own user" in err, err
    code, err = as_user(65534, [], socket_path)  # not in it: the folder could be anyone's
    assert code == "2" and f"belongs to uid {SERVICE_UID}" in err
