"""nanobotctl's parser and main: standard library only (of nanobotd only `cli` and `config.paths`), so it starts in tens
of milliseconds. Exits: 0 ok, 1 refused or a run failed, 2 cannot connect or usage, 130 interrupted. Option values are
checked here: a bad one exits 2 naming the option, not with the daemon's words about query parameters."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from nanobotd import __version__
from nanobotd.cli.client import DEFAULT_TIMEOUT_SECONDS, CannotConnect, Client, DaemonError, resolve_socket
from nanobotd.cli.commands import jobs, mcp, reports, search, sessions, setup, status, ui
from nanobotd.cli.invocation import (
    EXIT_BROKEN_PIPE,
    EXIT_CANNOT_CONNECT,
    EXIT_DAEMON_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Invocation,
)

# The daemon's vocabulary and limits, repeated here because nanobotctl must not import the daemon.
RUN_KINDS = ("consolidate", "flush", "dream", "lifecycle", "restore", "reindex")
SEARCH_MODES = ("search", "vsearch", "query")
DEFAULT_RUNS_LIMIT, MAX_RUNS_LIMIT = 50, 1000
DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT = 10, 100
MAX_CONTEXT_BUDGET = 2_000_000
DURATION = re.compile(r"^\d+(?:\.\d+)?\s*[smhdw]$", re.IGNORECASE)

Command = Callable[[Invocation], int]
AddCommand = Callable[[str, Command, str], argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    """The nanobotctl argument parser; global options are accepted before or after the command."""
    parser = argparse.ArgumentParser(prog="nanobotctl", description="Control a running nanobotd.")
    parser.add_argument("--version", action="version", version=f"nanobotctl {__version__}")
    _add_global_options(parser, argparse_defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, argparse_defaults=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="what to do:")

    def add(name: str, handler: Command, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    _add_session_commands(add)
    _add_job_commands(add)
    _add_report_commands(add)
    _add_search_commands(add)
    _add_agent_commands(add)
    return parser


def _add_session_commands(add: AddCommand) -> None:
    add("status", status.status, "daemon and workspace health")
    add("sessions", sessions.sessions, "list tracked sessions")
    _add_session_key(add("session", sessions.session, "show one session"))
    runs = add("runs", sessions.runs, "list recent runs, newest first (runs that changed nothing are hidden)")
    runs.add_argument("--kind", choices=RUN_KINDS, help="only runs of this job kind")
    runs.add_argument("--limit", type=whole_number("--limit", 1, MAX_RUNS_LIMIT), metavar="N",
                      help=f"show at most N runs (default {DEFAULT_RUNS_LIMIT}, at most {MAX_RUNS_LIMIT})")
    runs.add_argument("--all", action="store_true", help="also list the runs that changed nothing")
    add("run", sessions.run, "show what one run did (--json: its whole manifest)").add_argument(
        "run_id", metavar="RUN_ID", help="the run's id, as `nanobotctl runs` lists it")


def _add_job_commands(add: AddCommand) -> None:
    for name, handler, help_text in (("consolidate", jobs.consolidate,
                                      "archive everything unarchived in a session now (beside an agent that "
                                      "archives by itself: what left its session file)"),
                                     ("flush", jobs.flush, "flush durable facts from a session into today's note")):
        _add_wait(_add_session_key(add(name, handler, help_text)))
    _add_wait(add("dream", jobs.dream, "dream now, whatever the schedule"))
    add("dream-log", jobs.dream_log, "show a dream commit").add_argument(
        "target", nargs="?", metavar="RUN_ID|SHA", help="a dream's run id or commit (default: the newest dream)")
    restore = add("restore", jobs.restore, "undo a run or a dream commit as a new change")
    restore.add_argument("target", metavar="RUN_ID|SHA", help="the run id or dream commit to undo")
    restore.add_argument("--dry-run", action="store_true", help="show what would change")
    restore.add_argument("--force", action="store_true", help="restore even over later edits")
    _add_wait(restore)
    lifecycle = add("lifecycle", jobs.lifecycle, "age daily notes and compact history now")
    lifecycle.add_argument("--dry-run", action="store_true", help="show what would move or compact")
    _add_wait(lifecycle)
    _add_wait(add("reindex", jobs.reindex, "rebuild the search indexes and say what was indexed"))


def _add_report_commands(add: AddCommand) -> None:
    add("audit", reports.audit, "check each workspace's memory layout")
    since = option_value("--since", "a number and a unit (s, m, h, d or w), e.g. 30m, 12h, 7d or 2w", str.strip,
                         DURATION.match)
    add("observe", reports.observe, "job outcome metrics").add_argument(
        "--since", default="7d", type=since, metavar="PERIOD",
        help="how far back: a number and a unit, m h d or w, e.g. 30m, 12h, 2w (default 7d)")
    add("metrics", reports.prometheus, "the daemon's figures in the Prometheus text format (for node exporter's "
                                       "textfile collector)")


def _add_search_commands(add: AddCommand) -> None:
    found = add("search", search.search, "search memory")
    found.add_argument("query", help="the words to look for")
    found.add_argument("--limit", type=whole_number("--limit", 1, MAX_SEARCH_LIMIT), metavar="N",
                       help=f"show at most N hits (default {DEFAULT_SEARCH_LIMIT}, at most {MAX_SEARCH_LIMIT})")
    found.add_argument("--mode", choices=SEARCH_MODES,
                       help="how QMD searches: search by keywords (default), vsearch by meaning, query by both, "
                            "reranked; the builtin index always searches by keywords")
    context = _add_session_key(add("context", search.context, "the budgeted memory context for a session"))
    context.add_argument("--query", default="", metavar="TEXT",
                         help="what the agent is about to answer, to pick the memory that matters")
    context.add_argument("--budget", type=whole_number("--budget", 1, MAX_CONTEXT_BUDGET), metavar="TOKENS",
                         help="token budget (default: the workspace's context.budget_tokens)")


def _add_agent_commands(add: AddCommand) -> None:
    add("mcp", mcp.serve, "serve memory_search, memory_context and memory_recall to an agent as an MCP server "
                          "on stdio; give --socket (or --config), the agent passes no XDG_RUNTIME_DIR")
    page = add("ui", ui.ui, "serve a web page of the memory on 127.0.0.1 (a one-time link logs a browser in)")
    page.add_argument("--port", type=whole_number("--port", 0, 65535), default=0, metavar="PORT",
                      help="the port on 127.0.0.1 (default: a free one); over SSH: ssh -L PORT:127.0.0.1:PORT host")
    page.add_argument("--no-browser", dest="browser", action="store_false", help="only print the link")
    configure = add("setup", setup.setup, "show (and with --apply write) the agent config that runs nanobotd "
                                          "beside it: the MCP server, and the agent's own dream out of the way")
    configure.add_argument("agent", choices=("nanobot",), help="the agent to set up (nanobot)")
    configure.add_argument("--nanobot-config", metavar="PATH",
                           help=f"nanobot's config.json (default {setup.DEFAULT_NANOBOT_CONFIG})")
    configure.add_argument("--apply", action="store_true",
                           help="write the change, after a timestamped backup beside the file")


def _add_session_key(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("key", metavar="KEY", help="the session's key, as `nanobotctl sessions` lists it")
    return parser


def _add_global_options(parser: argparse.ArgumentParser, *, argparse_defaults: bool) -> None:
    # Sub-commands repeat the options with SUPPRESS defaults so `nanobotctl status --json` works too.
    def default(value: Any) -> Any:
        return value if argparse_defaults else argparse.SUPPRESS

    parser.add_argument("--socket", default=default(None), metavar="PATH", help="control socket path")
    parser.add_argument("--config", default=default(None), metavar="FILE", help="read [daemon] socket from this config")
    parser.add_argument("--workspace", default=default(None), type=workspace_name, metavar="NAME|PATH",
                        help="workspace name or path (needed when the daemon manages several)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print the daemon's whole answer as JSON, for scripts")
    seconds = option_value("--timeout", "a number of seconds above 0, e.g. 30 or 2.5", float,
                           lambda value: 0 < value < math.inf)
    parser.add_argument("--timeout", type=seconds, default=default(DEFAULT_TIMEOUT_SECONDS), metavar="SECONDS",
                        help=f"seconds to wait for each answer (default {DEFAULT_TIMEOUT_SECONDS:g})")


def _add_wait(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    waiting = parser.add_mutually_exclusive_group()
    waiting.add_argument("--no-wait", dest="wait", action="store_false",
                         help="queue the run and return at once; follow it with `nanobotctl run RUN_ID`")
    waiting.add_argument("--wait", dest="wait", action="store_true",
                         help="wait for the run to end and say what it changed (the default)")
    parser.set_defaults(wait=True)
    return parser


def option_value(option: str, accepts: str, parse: Callable[[str], Any],
                 allowed: Callable[[Any], Any]) -> Callable[[str], Any]:
    """An argparse `type=` for *option*: *parse*'s value when *allowed*, else `must be <accepts>, not 'text'`.
    It bears the option's name, which argparse uses in some messages."""

    def convert(text: str) -> Any:
        with contextlib.suppress(ValueError):
            value = parse(text)
            if allowed(value):
                return value
        raise argparse.ArgumentTypeError(f"must be {accepts}, not {text!r}")

    convert.__name__ = option
    return convert


def whole_number(option: str, low: int, high: int) -> Callable[[str], int]:
    """Whole numbers from *low* to *high*, for --limit, --budget and --port."""
    return option_value(option, f"a whole number from {low} to {high:,}", int, lambda value: low <= value <= high)


def workspace_name(text: str) -> str:
    """A workspace name as typed, or a path made absolute: the daemon runs elsewhere and matches full paths."""
    if "/" in text or text.startswith((".", "~")):
        return str(Path(text).expanduser().absolute())
    return text


def main(argv: list[str] | None = None, *, environ: Mapping[str, str] | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run nanobotctl and return its exit code (the console script passes it to sys.exit)."""
    environ = os.environ if environ is None else environ
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_request:  # --help, --version, usage errors
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_OK
    if args.config and not Path(args.config).expanduser().is_file():
        stderr.write(f"nanobotctl: config file {args.config} not found\n")
        return EXIT_CANNOT_CONNECT
    client = Client(resolve_socket(args, environ), args.timeout, args.workspace)
    return _run_command(Invocation(client=client, args=args, stdout=stdout, stderr=stderr))


def _run_command(invocation: Invocation) -> int:
    try:
        code = invocation.args.handler(invocation)
        invocation.stdout.flush()
        return code
    except CannotConnect as exc:
        invocation.stderr.write(f"nanobotctl: {exc}\n{exc.hint}\n")
        return EXIT_CANNOT_CONNECT
    except DaemonError as exc:
        invocation.stderr.write(f"nanobotctl: {exc.message}\n")
        return EXIT_DAEMON_ERROR
    except BrokenPipeError:
        _silence_stdout(invocation.stdout)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _silence_stdout(stdout: TextIO) -> None:
    # The reader went away (`nanobotctl runs | head`); point stdout at /dev/null so the final flush at
    # interpreter exit does not raise a second BrokenPipeError.
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
