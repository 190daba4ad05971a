"""nanobotctl: the command-line client of a running nanobotd, over its control socket.

Standard library only, importing nothing of nanobotd but `cli` and `config.paths`, so `nanobotctl status`
starts in tens of milliseconds. Exit codes: 0 ok, 1 the daemon refused or a run failed, 2 cannot connect.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO
from urllib.parse import quote

from nanobotd import __version__
from nanobotd.cli.client import DEFAULT_TIMEOUT_SECONDS, CannotConnect, Client, DaemonError, resolve_socket
from nanobotd.cli.render import format_cell, format_duration, format_fields, format_location, format_table

POLL_SECONDS = 0.2
PENDING_STATES = ("queued", "started")
FAILED_STATE = "failed"
EXIT_OK, EXIT_DAEMON_ERROR, EXIT_CANNOT_CONNECT = 0, 1, 2
EXIT_BROKEN_PIPE, EXIT_INTERRUPTED = 141, 130


class Context:
    """Everything a command needs: the client, the parsed arguments and where to write."""

    def __init__(self, client: Client, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> None:
        self.client = client
        self.args = args
        self.stdout = stdout
        self.stderr = stderr

    @property
    def as_json(self) -> bool:
        """Whether to print raw JSON instead of the human rendering."""
        return bool(self.args.json)

    def out(self, text: str = "") -> None:
        """Write one line to stdout."""
        self.stdout.write(text + "\n")

    def emit_json(self, data: Any) -> None:
        """Print *data* as indented JSON."""
        self.out(json.dumps(data, indent=2, ensure_ascii=False))


# ---- commands ----------------------------------------------------------------------------------------


def cmd_status(ctx: Context) -> int:
    """Daemon and per-workspace health."""
    status = ctx.client.get("/v1/status")
    if ctx.as_json:
        ctx.emit_json(status)
        return EXIT_OK
    ctx.out(f"nanobotd {status.get('version', '?')}  pid {status.get('pid', '?')}  "
            f"up {format_duration(status.get('uptime_seconds'))}")
    ctx.out(f"socket {ctx.client.socket_path}")
    for workspace in status.get("workspaces") or []:
        ctx.out()
        for line in _workspace_lines(workspace):
            ctx.out(line)
    return EXIT_OK


def _workspace_lines(workspace: Mapping[str, Any]) -> list[str]:
    watcher = workspace.get("watcher") or {}
    jobs = workspace.get("jobs") or {}
    watcher_state = "healthy" if watcher.get("healthy") else "UNHEALTHY"
    candidates = [
        ("sessions", "sessions_dir", f"{format_cell(workspace.get('sessions_dir'))} "
                                     f"({format_cell(workspace.get('sessions_watched'))} watched)"),
        ("unarchived", "unarchived_messages", f"{format_cell(workspace.get('unarchived_messages'))} messages, "
                                              f"{format_cell(workspace.get('unarchived_tokens'))} tokens"),
        ("watcher", "watcher", f"{watcher_state} ({format_cell(watcher.get('mode'))}), "
                               f"last reconcile {format_cell(watcher.get('last_reconcile'))}"),
        ("llm", "llm_mode", format_cell(workspace.get("llm_mode"))),
        ("git", "git", format_cell(workspace.get("git"))),
    ]
    rows = [(label, text) for label, key, text in candidates if key in workspace]
    for name, job in jobs.items():
        job = job if isinstance(job, dict) else {"state": job}
        running = " (running)" if job.get("running") else ""
        detail = {key: value for key, value in job.items() if key not in ("last_success", "next_run", "running")}
        text = f"last success {format_cell(job.get('last_success'))}, next {format_cell(job.get('next_run'))}"
        rows.append((name, text + running + (f", {format_cell(detail)}" if detail else "")))
    if "search" in workspace:
        rows.append(("search", format_cell(workspace["search"])))
    width = max((len(label) for label, _ in rows), default=0)
    header = f"workspace {workspace.get('name', '?')}  ({format_cell(workspace.get('path'))})"
    return [header] + [f"  {label:<{width}}  {text}" for label, text in rows]


def cmd_sessions(ctx: Context) -> int:
    """Every tracked session, one row each."""
    data = ctx.client.get("/v1/sessions")
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    columns = [("WORKSPACE", "workspace"), ("KEY", "key"), ("MESSAGES", "messages"),
               ("UNARCHIVED", "unarchived_messages"), ("TOKENS", "unarchived_tokens"),
               ("AGENT_ARCH", "agent_archived"), ("DAEMON_ARCH", "daemon_archived"), ("CORRUPT", "corrupt_lines"),
               ("UPDATED", "updated_at"), ("STATE", "state")]
    _print_rows(ctx, columns, data.get("sessions") or [], "no sessions tracked")
    return EXIT_OK


def cmd_session(ctx: Context) -> int:
    """One session in detail."""
    data = ctx.client.get(f"/v1/sessions/{quote(ctx.args.key, safe='')}")
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    for line in format_fields(data.get("session") or {}):
        ctx.out(line)
    return EXIT_OK


def cmd_runs(ctx: Context) -> int:
    """Recent runs, newest first as the daemon orders them."""
    data = ctx.client.get("/v1/runs", {"kind": ctx.args.kind, "limit": ctx.args.limit})
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    columns = [("RUN_ID", "run_id"), ("KIND", "kind"), ("WORKSPACE", "workspace"), ("SESSION", "session_key"),
               ("STATE", "state"), ("OUTCOME", "outcome"), ("STARTED", "started_at"), ("FINISHED", "finished_at")]
    _print_rows(ctx, columns, data.get("runs") or [], "no runs")
    return EXIT_OK


def cmd_run(ctx: Context) -> int:
    """One run with its manifest."""
    data = _get_run(ctx, ctx.args.run_id)
    if ctx.as_json:
        ctx.emit_json(data)
    else:
        _print_run(ctx, data.get("run") or {})
    return EXIT_OK


def _get_run(ctx: Context, run_id: str) -> dict:
    return ctx.client.get(f"/v1/runs/{quote(run_id, safe='')}")


def _print_run(ctx: Context, run: Mapping[str, Any]) -> None:
    manifest = run.get("manifest")
    for line in format_fields({key: value for key, value in run.items() if key != "manifest"}):
        ctx.out(line)
    if manifest is not None:
        ctx.out("manifest:")
        ctx.out(json.dumps(manifest, indent=2, ensure_ascii=False))


def _print_rows(ctx: Context, columns: list[tuple[str, str]], items: list[Mapping[str, Any]], empty: str) -> None:
    if not items:
        ctx.out(empty)
        return
    rows = [[item.get(key) for _, key in columns] for item in items]
    for line in format_table([title for title, _ in columns], rows):
        ctx.out(line)


def cmd_consolidate(ctx: Context) -> int:
    """Archive a session's unarchived tail now."""
    return _report_started(ctx, ctx.client.post("/v1/consolidate", {"session": ctx.args.key}))


def cmd_flush(ctx: Context) -> int:
    """Extract durable facts from a session into today's note now."""
    return _report_started(ctx, ctx.client.post("/v1/flush", {"session": ctx.args.key}))


def cmd_dream(ctx: Context) -> int:
    """Queue a dream (with --now: regardless of the schedule)."""
    return _report_started(ctx, ctx.client.post("/v1/dream", {"now": ctx.args.now}))


def cmd_reindex(ctx: Context) -> int:
    """Refresh the search indexes."""
    return _report_started(ctx, ctx.client.post("/v1/reindex"))


def cmd_restore(ctx: Context) -> int:
    """Undo a run or a dream commit (with --dry-run: show the plan)."""
    body = {"target": ctx.args.target, "dry_run": ctx.args.dry_run, "force": ctx.args.force}
    return _report_started(ctx, ctx.client.post("/v1/restore", body))


def cmd_lifecycle(ctx: Context) -> int:
    """Age daily notes and compact history now or show the plan."""
    return _report_started(ctx, ctx.client.post("/v1/lifecycle", {"now": ctx.args.now, "dry_run": ctx.args.dry_run}))


def _report_started(ctx: Context, data: dict) -> int:
    """Print a plan, the queued run ids, or (with --wait) the finished runs."""
    run_ids = [data["run_id"]] if data.get("run_id") else list(data.get("run_ids") or [])
    if not run_ids or not getattr(ctx.args, "wait", False):
        if ctx.as_json:
            ctx.emit_json(data)
        elif "plan" in data:
            for line in data.get("plan") or ["nothing to do"]:
                ctx.out(str(line))
        elif run_ids:
            for run_id in run_ids:
                ctx.out(f"queued run {run_id}")
        else:
            for line in format_fields(data) or ["done"]:
                ctx.out(line)
        return EXIT_OK
    runs = [_wait_for_run(ctx, run_id) for run_id in run_ids]
    if ctx.as_json:
        ctx.emit_json({"run": runs[0]} if len(runs) == 1 else {"runs": runs})
    else:
        for index, run in enumerate(runs):
            if index:
                ctx.out()
            _print_run(ctx, run)
    return EXIT_DAEMON_ERROR if any(run.get("state") == FAILED_STATE for run in runs) else EXIT_OK


def _wait_for_run(ctx: Context, run_id: str) -> dict:
    while True:
        run = _get_run(ctx, run_id).get("run") or {}
        if run.get("state") not in PENDING_STATES:
            return run
        time.sleep(POLL_SECONDS)


def cmd_dream_log(ctx: Context) -> int:
    """A dream commit: message, then diff."""
    data = ctx.client.get("/v1/dream-log", {"target": ctx.args.target})
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    commit = data.get("commit") or {}
    ctx.out(f"commit {commit.get('sha', '?')}")
    ctx.out(f"Author: {format_cell(commit.get('author'))}")
    ctx.out(f"Date:   {format_cell(commit.get('date'))}")
    ctx.out()
    for line in str(commit.get("message") or "").rstrip("\n").splitlines():
        ctx.out(f"    {line}".rstrip())
    diff = str(commit.get("diff") or "")
    if diff:
        ctx.out()
        ctx.stdout.write(diff if diff.endswith("\n") else diff + "\n")
    return EXIT_OK


def cmd_audit(ctx: Context) -> int:
    """Each workspace's memory layout, state and problems with their fixes."""
    data = ctx.client.get("/v1/audit")
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    for index, workspace in enumerate(data.get("workspaces") or []):
        if index:
            ctx.out()
        ctx.out(f"workspace {workspace.get('name', '?')}")
        for line in workspace.get("plan") or []:
            ctx.out(f"  {line}")
        for line in format_fields(workspace.get("state") or {}, indent="  "):
            ctx.out(line)
        problems = workspace.get("problems") or []
        ctx.out(f"  problems: {len(problems) or 'none'}")
        for problem in problems:
            ctx.out(f"  - {format_cell(problem.get('problem'))}")
            ctx.out(f"    fix: {format_cell(problem.get('fix'))}")
    return EXIT_OK


def cmd_observe(ctx: Context) -> int:
    """Per-job outcome counts, tokens and latency over a period."""
    data = ctx.client.get("/v1/metrics", {"since": ctx.args.since})
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    ctx.out(f"since {format_cell(data.get('since'))}")
    columns = [("KIND", "kind"), ("WORKSPACE", "workspace"), ("TOTAL", "total"), ("WRITTEN", "written"),
               ("NO_CHANGE", "no_change"), ("GUARD_REJ", "guard_rejected"), ("RAW", "raw_fallback"),
               ("ERROR", "error"), ("TOKENS", "tokens"), ("P50_MS", "latency_ms_p50"), ("P95_MS", "latency_ms_p95"),
               ("RESTORED", "restored")]
    _print_rows(ctx, columns, data.get("rows") or [], "no runs in this period")
    return EXIT_OK


def cmd_search(ctx: Context) -> int:
    """Search memory; numbered hits with where and when."""
    data = ctx.client.get("/v1/search", {"q": ctx.args.query, "limit": ctx.args.limit, "mode": ctx.args.mode})
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    if data.get("degraded"):
        ctx.stderr.write(f"nanobotctl: search degraded: {format_cell(data['degraded'])}\n")
    hits = data.get("hits") or []
    if not hits:
        ctx.out("no hits")
    for number, hit in enumerate(hits, 1):
        score = hit.get("score")
        score_text = f"{score:.3f}" if isinstance(score, (int, float)) else format_cell(score)
        ctx.out(f"{number}. {format_location(hit)}  {format_cell(hit.get('when'))}  "
                f"[{format_cell(hit.get('source'))}, score {score_text}]")
        for line in str(hit.get("snippet") or "").strip().splitlines():
            ctx.out(f"   {line}")
    return EXIT_OK


def cmd_context(ctx: Context) -> int:
    """The budgeted memory context an agent would inject for a session and query."""
    data = ctx.client.get("/v1/context", {"session": ctx.args.key, "query": ctx.args.query,
                                          "budget_tokens": ctx.args.budget})
    if ctx.as_json:
        ctx.emit_json(data)
        return EXIT_OK
    text = str(data.get("text") or "")
    ctx.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return EXIT_OK


# ---- argument parsing --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The nanobotctl argument parser; global options are accepted before or after the command."""
    parser = argparse.ArgumentParser(prog="nanobotctl", description="Control a running nanobotd.")
    parser.add_argument("--version", action="version", version=f"nanobotctl {__version__}")
    _add_global_options(parser, argparse_defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, argparse_defaults=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Callable[[Context], int], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    add("status", cmd_status, "daemon and workspace health")
    add("sessions", cmd_sessions, "list tracked sessions")
    add("session", cmd_session, "show one session").add_argument("key")
    runs = add("runs", cmd_runs, "list recent runs")
    runs.add_argument("--kind")
    runs.add_argument("--limit", type=int)
    add("run", cmd_run, "show one run and its manifest").add_argument("run_id")
    for name, handler, help_text in (("consolidate", cmd_consolidate, "archive a session's unarchived tail now"),
                                     ("flush", cmd_flush, "flush durable facts from a session into today's note")):
        sub = add(name, handler, help_text)
        sub.add_argument("key")
        _add_wait(sub)
    dream = add("dream", cmd_dream, "queue a dream")
    dream.add_argument("--now", action="store_true", help="run now, regardless of the schedule")
    _add_wait(dream)
    add("dream-log", cmd_dream_log, "show a dream commit").add_argument("target", nargs="?", metavar="RUN_ID|SHA")
    restore = add("restore", cmd_restore, "undo a run or a dream commit as a new change")
    restore.add_argument("target", metavar="RUN_ID|SHA")
    restore.add_argument("--dry-run", action="store_true", help="show what would change")
    restore.add_argument("--force", action="store_true", help="restore even over later edits")
    _add_wait(restore)
    lifecycle = add("lifecycle", cmd_lifecycle, "age daily notes and compact history")
    lifecycle.add_argument("--now", action="store_true")
    lifecycle.add_argument("--dry-run", action="store_true")
    _add_wait(lifecycle)
    add("audit", cmd_audit, "check each workspace's memory layout")
    add("observe", cmd_observe, "job outcome metrics").add_argument("--since", default="7d")
    search = add("search", cmd_search, "search memory")
    search.add_argument("query")
    search.add_argument("--limit", type=int)
    search.add_argument("--mode", choices=("search", "vsearch", "query"))
    context = add("context", cmd_context, "the budgeted memory context for a session")
    context.add_argument("key")
    context.add_argument("--query", default="")
    context.add_argument("--budget", type=int)
    reindex = add("reindex", cmd_reindex, "refresh the search indexes")
    _add_wait(reindex)
    return parser


def _add_global_options(parser: argparse.ArgumentParser, *, argparse_defaults: bool) -> None:
    # Sub-commands repeat the options with SUPPRESS defaults so `nanobotctl status --json` works too.
    def default(value: Any) -> Any:
        return value if argparse_defaults else argparse.SUPPRESS

    parser.add_argument("--socket", default=default(None), help="control socket path")
    parser.add_argument("--config", default=default(None), help="read [daemon] socket from this config")
    parser.add_argument("--workspace", default=default(None), help="workspace name or path")
    parser.add_argument("--json", action="store_true", default=default(False), help="print the raw JSON answer")
    parser.add_argument("--timeout", type=float, default=default(DEFAULT_TIMEOUT_SECONDS),
                        help=f"seconds to wait for each answer (default {DEFAULT_TIMEOUT_SECONDS:g})")


def _add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="wait for the run to finish and print it")


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
    context = Context(client=client, args=args, stdout=stdout, stderr=stderr)
    try:
        code = args.handler(context)
        stdout.flush()
        return code
    except CannotConnect as exc:
        stderr.write(f"nanobotctl: {exc}\n{exc.hint}\n")
        return EXIT_CANNOT_CONNECT
    except DaemonError as exc:
        stderr.write(f"nanobotctl: {exc.message}\n")
        return EXIT_DAEMON_ERROR
    except BrokenPipeError:
        _silence_stdout(stdout)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _silence_stdout(stdout: TextIO) -> None:
    # The reader went away (`nanobotctl runs | head`); point stdout at /dev/null so the final flush at
    # interpreter exit does not raise a second BrokenPipeError.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
