"""nanobotd/cli/nanobotctl.py: options, exit codes, and the real console script (cheap imports, quick answers)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanobotd.cli import invocation, nanobotd
from nanobotd.cli import nanobotctl as ctl
from tests.cli.fakedaemon import NANOBOTCTL, STATUS, FakeDaemon, run_ctl, subprocess_env

HEAVY_MODULES = ("loguru", "litellm", "git", "watchdog", "sdnotify", "apscheduler", "tiktoken", "nanobotd.api", "mcp",
                 "anyio", "pydantic", "starlette", "uvicorn", "jinja2", "markdown_it", "prometheus_client")
ALLOWED_OWN_MODULES = {"nanobotd", "nanobotd.cli", "nanobotd.cli.client", "nanobotd.cli.invocation",
                       "nanobotd.cli.commands.mcp", "nanobotd.cli.commands.setup",
                       "nanobotd.cli.nanobotctl", "nanobotd.cli.render", "nanobotd.cli.commands",
                       "nanobotd.cli.commands.jobs", "nanobotd.cli.commands.reports", "nanobotd.cli.commands.search",
                       "nanobotd.cli.commands.sessions", "nanobotd.cli.commands.status",
                       "nanobotd.cli.commands.ui",
                       "nanobotd.cli.runtext", "nanobotd.cli.waiting", "nanobotd.config", "nanobotd.config.paths"}
# Bad option values are refused before the daemon is asked, naming the option.
REFUSED = [
    (["runs", "--limit", "0"], "argument --limit: must be a whole number from 1 to 1,000, not '0'"),
    (["runs", "--limit", "many"], "argument --limit: must be a whole number from 1 to 1,000, not 'many'"),
    (["search", "x", "--limit", "101"], "argument --limit: must be a whole number from 1 to 100, not '101'"),
    (["context", "k", "--budget", "-5"], "argument --budget: must be a whole number from 1 to 2,000,000, not '-5'"),
    (["observe", "--since", "yesterday"], "argument --since: must be a number and a unit (s, m, h, d or w)"),
    (["--timeout", "0", "status"], "argument --timeout: must be a number of seconds above 0"),
]


def test_json_output_is_the_raw_answer(socket_path: Path, daemon: FakeDaemon) -> None:
    for argv in (["--json", "status"], ["status", "--json"], ["sessions", "--json"], ["search", "x", "--json"],
                 ["--json", "consolidate", "cli:direct"], ["--json", "dream", "--wait"]):
        code, out, _ = run_ctl(socket_path, *argv)
        assert code == 0
        json.loads(out)
    assert json.loads(run_ctl(socket_path, "status", "--json")[1]) == STATUS


def test_a_missing_config_file_is_reported(tmp_path: Path) -> None:
    stderr = io.StringIO()
    code = ctl.main(["--config", str(tmp_path / "none.toml"), "status"], environ={}, stdout=io.StringIO(),
                    stderr=stderr)
    assert code == 2
    assert "none.toml not found" in stderr.getvalue()


def test_a_closed_stdout_ends_quietly(socket_path: Path, daemon: FakeDaemon) -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError()

    stderr = io.StringIO()
    code = ctl.main(["--socket", str(socket_path), "sessions"], environ={}, stdout=ClosedPipe(), stderr=stderr)
    assert code == invocation.EXIT_BROKEN_PIPE
    assert stderr.getvalue() == ""


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert ctl.main(["frobnicate"], environ={}) == 2
    assert ctl.main(["--version"], environ={}) == 0
    assert "nanobotctl 0.1.0" in capsys.readouterr().out


def test_nanobotctl_status_as_a_subprocess(socket_path: Path, daemon: FakeDaemon) -> None:
    result = subprocess.run([str(NANOBOTCTL), "status"], capture_output=True, text=True, timeout=30,
                            env=subprocess_env(socket_path))
    assert result.returncode == 0, result.stderr
    assert "workspace main" in result.stdout
    failed = subprocess.run([str(NANOBOTCTL), "--socket", str(socket_path) + ".none", "status"],
                            capture_output=True, text=True, timeout=30, env=subprocess_env(socket_path))
    assert failed.returncode == 2
    assert "nanobotd run --workspace DIR" in failed.stderr


def test_nanobotctl_status_imports_only_the_standard_library(socket_path: Path, daemon: FakeDaemon) -> None:
    script = (
        "import sys; before = set(sys.modules)\n"
        "from nanobotd.cli import nanobotctl as ctl\n"
        "code = ctl.main(['status'])\n"
        "print('MODULES', ' '.join(sorted(set(sys.modules) - before)))\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                            env=subprocess_env(socket_path))
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split("MODULES ", 1)[1].split()
    foreign = [name for name in loaded
               if name.split(".")[0] not in sys.stdlib_module_names and name not in ALLOWED_OWN_MODULES]
    assert foreign == []

    timed = subprocess.run([sys.executable, "-X", "importtime", str(NANOBOTCTL), "status"], capture_output=True,
                           text=True, timeout=30, env=subprocess_env(socket_path))
    imported = {line.rsplit("|", 1)[-1].strip() for line in timed.stderr.splitlines() if line.startswith("import time")}
    assert "nanobotd.cli.nanobotctl" in imported
    assert [name for name in imported if name.startswith(HEAVY_MODULES)] == []


def subcommands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's sub-commands by name (empty when it has none)."""
    found = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def test_every_argument_and_option_in_the_help_is_described() -> None:
    for program, parser in (("nanobotctl", ctl.build_parser()), ("nanobotd", nanobotd.build_parser())):
        commands = subcommands_of(parser)
        undescribed = [f"{program} {name} {action.dest}"
                       for name, command in [("", parser), *commands.items()]
                       for action in command._actions if not action.help]
        assert undescribed == []
        assert not [name for name, command in commands.items() if not command.description]
    commands = subcommands_of(ctl.build_parser())
    assert set(commands["runs"]._option_string_actions["--kind"].choices) == set(ctl.RUN_KINDS)
    assert "30m, 12h" in commands["observe"]._option_string_actions["--since"].help


def test_the_readme_lists_every_command() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    cli_section = readme.split("## nanobotctl", 1)[1].split("\n## ", 1)[0]
    listed = {line.split()[1] for line in cli_section.splitlines() if line.startswith("nanobotctl ")}
    assert set(subcommands_of(ctl.build_parser())) - listed == set()


def test_runs_refuses_an_unknown_kind_before_asking_the_daemon(socket_path: Path, daemon: FakeDaemon,
                                                               capsys: pytest.CaptureFixture) -> None:
    assert run_ctl(socket_path, "runs", "--kind", "nap")[0] == 2
    assert "invalid choice: 'nap'" in capsys.readouterr().err
    assert daemon.requests == []


@pytest.mark.parametrize("argv,message", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_a_bad_value_exits_2_naming_the_option_and_what_it_takes(socket_path: Path, daemon: FakeDaemon,
                                                                capsys: pytest.CaptureFixture, argv: list[str],
                                                                message: str) -> None:
    assert run_ctl(socket_path, *argv)[0] == 2
    err = capsys.readouterr().err
    assert message in err and "query parameter" not in err
    assert daemon.requests == []
