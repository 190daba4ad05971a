"""Commands that start jobs (consolidate, flush, dream, lifecycle, reindex, restore) and show dream commits.

A job command prints the queued run ids, a plan (--dry-run), or with --wait the finished runs.
"""

from __future__ import annotations

import time

from nanobotd.cli.commands.sessions import fetch_run
from nanobotd.cli.invocation import EXIT_DAEMON_ERROR, EXIT_OK, Invocation
from nanobotd.cli.render import format_cell, format_fields, format_run

POLL_SECONDS = 0.2
PENDING_STATES = ("queued", "started")
FAILED_STATE = "failed"


def consolidate(invocation: Invocation) -> int:
    """Archive a session's unarchived tail now, instead of waiting for the token threshold."""
    return report_started(invocation, invocation.client.post("/v1/consolidate", {"session": invocation.args.key}))


def flush(invocation: Invocation) -> int:
    """Extract durable facts from a session into today's note now, instead of waiting for the flush threshold."""
    return report_started(invocation, invocation.client.post("/v1/flush", {"session": invocation.args.key}))


def dream(invocation: Invocation) -> int:
    """Queue a dream now, whatever the schedule says, to tidy memory after a busy day."""
    return report_started(invocation, invocation.client.post("/v1/dream"))


def lifecycle(invocation: Invocation) -> int:
    """Age daily notes and compact history now instead of on schedule, or show the plan."""
    return report_started(invocation, invocation.client.post("/v1/lifecycle", {"dry_run": invocation.args.dry_run}))


def reindex(invocation: Invocation) -> int:
    """Refresh the search indexes, after editing memory files by hand for instance.

    The daemon answers once the indexes are rebuilt, so there is no run to wait for.
    """
    return report_started(invocation, invocation.client.post("/v1/reindex"))


def restore(invocation: Invocation) -> int:
    """Undo a run or a dream commit as a new change (with --dry-run: show the plan)."""
    args = invocation.args
    body = {"target": args.target, "dry_run": args.dry_run, "force": args.force}
    return report_started(invocation, invocation.client.post("/v1/restore", body))


def dream_log(invocation: Invocation) -> int:
    """A dream commit, message then diff, to see what a dream changed before keeping or restoring it."""
    return invocation.answer(invocation.client.get("/v1/dream-log", {"target": invocation.args.target}),
                             _commit_lines)


def report_started(invocation: Invocation, data: dict) -> int:
    """Print a plan, the queued run ids, or (with --wait) the finished runs; 1 when a waited run failed."""
    run_ids = [data["run_id"]] if data.get("run_id") else list(data.get("run_ids") or [])
    if not run_ids or not getattr(invocation.args, "wait", False):
        return invocation.answer(data, lambda data: _started_lines(data, run_ids))
    runs = [wait_for_run(invocation, run_id) for run_id in run_ids]
    if invocation.as_json:
        invocation.emit_json({"run": runs[0]} if len(runs) == 1 else {"runs": runs})
    else:
        for index, run in enumerate(runs):
            if index:
                invocation.out()
            invocation.out_lines(format_run(run))
    return EXIT_DAEMON_ERROR if any(run.get("state") == FAILED_STATE for run in runs) else EXIT_OK


def wait_for_run(invocation: Invocation, run_id: str) -> dict:
    """Poll the run until it has left the queue and finished, then return it."""
    while True:
        run = fetch_run(invocation, run_id).get("run") or {}
        if run.get("state") not in PENDING_STATES:
            return run
        time.sleep(POLL_SECONDS)


def _started_lines(data: dict, run_ids: list[str]) -> list[str]:
    if "plan" in data:
        return [str(line) for line in data.get("plan") or ["nothing to do"]]
    if run_ids:
        return [f"queued run {run_id}" for run_id in run_ids]
    return format_fields(data) or ["done"]


def _commit_lines(data: dict) -> list[str]:
    commit = data.get("commit") or {}
    lines = [f"commit {commit.get('sha', '?')}", f"Author: {format_cell(commit.get('author'))}",
             f"Date:   {format_cell(commit.get('date'))}", ""]
    lines.extend(f"    {line}".rstrip() for line in str(commit.get("message") or "").rstrip("\n").splitlines())
    diff = str(commit.get("diff") or "")
    if diff:
        lines.extend(["", diff.removesuffix("\n")])
    return lines
