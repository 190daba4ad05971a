"""nanobotd/cli/arguments.py: bad option values are refused before the daemon is asked, naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.fakedaemon import FakeDaemon, run_ctl

REFUSED = [
    (["runs", "--limit", "0"], "argument --limit: must be a whole number from 1 to 1,000, not '0'"),
    (["runs", "--limit", "many"], "argument --limit: must be a whole number from 1 to 1,000, not 'many'"),
    (["search", "x", "--limit", "101"], "argument --limit: must be a whole number from 1 to 100, not '101'"),
    (["context", "k", "--budget", "-5"], "argument --budget: must be a whole number from 1 to 2,000,000, not '-5'"),
    (["observe", "--since", "yesterday"], "argument --since: must be a number and a unit (s, m, h, d or w)"),
    (["--timeout", "0", "status"], "argument --timeout: must be a number of seconds above 0"),
]


@pytest.mark.parametrize("argv,message", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_a_bad_value_exits_2_naming_the_option_and_what_it_takes(socket_path: Path, daemon: FakeDaemon,
                                                                capsys: pytest.CaptureFixture, argv: list[str],
                                                                message: str) -> None:
    assert run_ctl(socket_path, *argv)[0] == 2
    err = capsys.readouterr().err
    assert message in err and "query parameter" not in err
    assert daemon.requests == []
