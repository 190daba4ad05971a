"""Commands that start runs (consolidate, flush, dream, lifecycle, reindex, restore) and show dream commits: each
waits for its run and says what it changed (--no-wait: queue it; --dry-run: print the plan)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from nanobotd.cli.client import DaemonError
from nanobotd.cli.invocation import EXIT_DAEMON_ERROR, EXIT_INTERRUPTED, EXIT_OK, Invocation
from nanobotd.cli.render import format_cell
from nanobotd.cli.runtext import summary_lines
from nanobotd.cli.waiting import StoppedWaiting, wait_for_runs

FAILED_STATES = ("failed", "rolled_back", "cancelled")

# Once the runs have ended: more (label, text) rows for the summary, notes below it, and more JSON fields
# (what a consolidation left unarchived, say).
Epilogue = Callable[[Invocation, list[dict]], tuple[list[tuple[str, str]], list[str], dict]]


def consolidate(invocation: Invocation) -> int:
    """Archive what a session has unarchived now, then say what is left (and whether a queued run was joined)."""
    key = invocation.args.key
    answer = invocation.client.post("/v1/consolidate", {"session": key})
    return start_runs(invocation, answer, epilogue=lambda invocation, runs: _left_in_session(invocation, answer))


def flush(invocation: Invocation) -> int:
    """Extract durable facts from a session into today's note now, instead of waiting for the flush threshold."""
    return start_runs(invocation, invocation.client.post("/v1/flush", {"session": invocation.args.key}))


def dream(invocation: Invocation) -> int:
    """Dream now, whatever the schedule says, to tidy memory after a busy day."""
    return start_runs(invocation, invocation.client.post("/v1/dream"))


def lifecycle(invocation: Invocation) -> int:
    """Age daily notes and compact history now instead of on schedule, or show the plan."""
    answer = invocation.client.post("/v1/lifecycle", {"dry_run": invocation.args.dry_run})
    return start_runs(invocation, answer, dry_run_subject="the lifecycle", apply_hint="nanobotctl lifecycle")


def reindex(invocation: Invocation) -> int:
    """Rebuild the search indexes, after editing memory files by hand for instance."""
    return start_runs(invocation, invocation.client.post("/v1/reindex"))


def restore(invocation: Invocation) -> int:
    """Undo a run or a dream commit as a new change (with --dry-run: show the plan, change nothing)."""
    args = invocation.args
    body = {"target": args.target, "dry_run": args.dry_run, "force": args.force}
    force = " --force" if args.force else ""
    return start_runs(invocation, invocation.client.post("/v1/restore", body),
                      dry_run_subject=f"restoring {args.target}", apply_hint=f"nanobotctl restore {args.target}{force}")


def dream_log(invocation: Invocation) -> int:
    """A dream commit, message then diff, to see what a dream changed before keeping or restoring it."""
    return invocation.answer(invocation.client.get("/v1/dream-log", {"target": invocation.args.target}),
                             _commit_lines)


def start_runs(invocation: Invocation, answer: dict, *, epilogue: Epilogue | None = None,
               dry_run_subject: str = "it", apply_hint: str = "") -> int:
    """Print a plan, or the queued runs (--no-wait), or wait and summarise; 1 when a run failed, 130 on Ctrl-C."""
    run_ids = [answer["run_id"]] if answer.get("run_id") else list(answer.get("run_ids") or [])
    if "plan" in answer:
        return invocation.answer(answer, lambda data: _plan_lines(data, dry_run_subject, apply_hint))
    if not run_ids or not invocation.args.wait:
        return invocation.answer(answer, lambda data: _queued_lines(run_ids))
    try:
        runs = wait_for_runs(invocation, run_ids)
    except StoppedWaiting as stopped:
        follow = "; ".join(f"nanobotctl run {run_id}" for run_id in stopped.run_ids)
        invocation.warn(f"stopped waiting; the run goes on in the daemon (Ctrl-C does not cancel it). "
                        f"Follow it with: {follow}")
        return EXIT_INTERRUPTED
    extra_rows, notes, extra_data = epilogue(invocation, runs) if epilogue is not None else ([], [], {})
    if invocation.args.json:
        invocation.emit_json({**answer, **({"run": runs[0]} if len(runs) == 1 else {"runs": runs}), **extra_data})
    else:
        if answer.get("joined"):
            invocation.out(f"joined run {run_ids[0]}, already queued for session {answer.get('session')}")
        for index, run in enumerate(runs):
            if index:
                invocation.out()
            invocation.out_lines(summary_lines(run, extra_rows if index == len(runs) - 1 else []))
        invocation.out_lines(notes)
    return EXIT_DAEMON_ERROR if any(run.get("state") in FAILED_STATES for run in runs) else EXIT_OK


def _queued_lines(run_ids: list[str]) -> list[str]:
    if not run_ids:
        return ["nothing to do: no run was started"]
    lines = [f"queued run {run_id}" for run_id in run_ids]
    target = run_ids[0] if len(run_ids) == 1 else "RUN_ID"
    return lines + [f"Follow it with: nanobotctl run {target}"]


def _plan_lines(data: dict, subject: str, apply_hint: str) -> list[str]:
    plan = [str(line) for line in data.get("plan") or []] or ["nothing to do"]
    lines = [f"Dry run: {subject} would"] + [f"  {line}" for line in plan]
    lines.append("Nothing was changed." + (f" To do it: {apply_hint}" if apply_hint else ""))
    return lines


def _left_in_session(invocation: Invocation, answer: dict) -> tuple[list[tuple[str, str]], list[str], dict]:
    """After a consolidation: what the session still has unarchived, and why, beside an agent."""
    key = answer.get("session")
    if not key:
        return [], [], {}
    try:
        session = invocation.client.get(f"/v1/sessions/{quote(key, safe='')}").get("session") or {}
    except DaemonError:
        return [], [], {}
    messages, tokens = session.get("unarchived_messages") or 0, session.get("unarchived_tokens") or 0
    rows = [("left unarchived", f"{format_cell(messages)} messages, {format_cell(tokens)} tokens")]
    notes = []
    if messages and answer.get("consolidation_mode") == "companion":
        notes.append("Companion mode: messages still in the session file are the agent's to archive; "
                     "nanobotd archives what leaves the file unarchived.")
    return rows, notes, {"left_unarchived": {"messages": messages, "tokens": tokens}}


def _commit_lines(data: dict) -> list[str]:
    commit = data.get("commit") or {}
    lines = [f"commit {commit.get('sha', '?')}", f"Author: {format_cell(commit.get('author'))}",
             f"Date:   {format_cell(commit.get('date'))}", ""]
    lines.extend(f"    {line}".rstrip() for line in str(commit.get("message") or "").rstrip("\n").splitlines())
    diff = str(commit.get("diff") or "")
    if diff:
        lines.extend(["", diff.removesuffix("\n")])
    return lines
