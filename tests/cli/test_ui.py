"""nanobotd/cli/commands/ui.py: the command's checks before it serves, on a canned daemon."""

from __future__ import annotations

import socket
from pathlib import Path

from nanobotd.cli.commands import ui
from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_without_a_daemon_nothing_is_served_and_it_says_how_to_start_one(socket_path: Path) -> None:
    code, out, err = run_ctl(socket_path, "ui", "--no-browser")
    assert (code, out) == (2, "") and "nanobotd run --workspace DIR" in err


def test_a_port_in_use_is_named_and_nothing_is_served(socket_path: Path, daemon: FakeDaemon) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, out, err = run_ctl(socket_path, "ui", "--port", str(port), "--no-browser")
    assert (code, out) == (2, "") and f"cannot listen on 127.0.0.1:{port}" in err


def test_the_page_listens_on_the_loopback_address_only() -> None:
    with ui.bind(0) as listener:
        assert listener.getsockname()[0] == "127.0.0.1" and listener.getsockname()[1] > 0


def test_a_bad_port_is_refused_before_the_daemon_is_asked(socket_path: Path, daemon: FakeDaemon, capsys) -> None:
    assert run_ctl(socket_path, "ui", "--port", "70000")[0] == 2
    assert "--port" in capsys.readouterr().err and daemon.requests == []
