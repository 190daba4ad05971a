"""sd_notify messages reach a fake NOTIFY_SOCKET datagram server, in order and in ASCII."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from nanobotd.notify import MAX_STATUS_CHARS, Notifier, clean_status, watchdog_interval


@pytest.fixture
def path_listener(tmp_path: Path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    listener.bind(address)
    listener.settimeout(5)
    yield address, listener
    listener.close()


@pytest.fixture
def abstract_listener():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"nanobotd-test-{uuid.uuid4().hex}"
    listener.bind("\0" + name)
    listener.settimeout(5)
    yield "@" + name, listener
    listener.close()


def received(listener: socket.socket, count: int) -> list[str]:
    return [listener.recv(4096).decode("ascii") for _ in range(count)]


def send_all(notifier: Notifier) -> None:
    notifier.ready()
    notifier.watchdog()
    notifier.status("Größe ✓ café\nsecond line")
    notifier.reloading()
    notifier.stopping()


@pytest.mark.parametrize("listener_fixture", ["path_listener", "abstract_listener"])
def test_messages_arrive_in_the_order_sent(listener_fixture: str, request: pytest.FixtureRequest) -> None:
    address, listener = request.getfixturevalue(listener_fixture)
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.active
    before_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    send_all(notifier)
    ready, watchdog, status, reloading, stopping = received(listener, 5)
    assert (ready, watchdog, stopping) == ("READY=1", "WATCHDOG=1", "STOPPING=1")
    assert status == "STATUS=Gro?e ? cafe second line"
    reload_line, usec_line = reloading.split("\n")
    assert reload_line == "RELOADING=1"
    assert usec_line.startswith("MONOTONIC_USEC=")
    assert 0 <= int(usec_line.split("=")[1]) - before_usec < 5_000_000


def test_ready_can_carry_a_status(path_listener) -> None:
    address, listener = path_listener
    Notifier({"NOTIFY_SOCKET": address}).ready("watching 2 workspaces")
    assert received(listener, 1) == ["READY=1\nSTATUS=watching 2 workspaces"]


def test_the_given_environ_wins_over_the_process_environment(path_listener, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    address, listener = path_listener
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "elsewhere.sock"))
    Notifier({"NOTIFY_SOCKET": address}).watchdog()
    assert received(listener, 1) == ["WATCHDOG=1"]


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.active
    send_all(notifier)


def test_an_unreachable_notify_socket_is_not_fatal(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert not notifier.active
    send_all(notifier)


def test_status_text_becomes_one_short_ascii_line() -> None:
    assert clean_status("naïve résumé\r\n\tdone") == "naive resume done"
    assert clean_status("日本語 ok") == "??? ok"
    assert clean_status("bell\x07") == "bell?"
    assert len(clean_status("x" * 1000)) == MAX_STATUS_CHARS


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "60000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "7"}, pid=7) == 30.0


@pytest.mark.parametrize("environ", [
    {},
    {"WATCHDOG_USEC": "0"},
    {"WATCHDOG_USEC": "soon"},
    {"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"},
])
def test_no_watchdog_interval_when_the_watchdog_is_off_or_for_another_process(environ: dict) -> None:
    assert watchdog_interval(environ, pid=4242) is None
