"""Commands that read the daemon's state: sessions, session, runs, run (status has its own module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from nanobotd.cli.invocation import Invocation
from nanobotd.cli.render import format_fields, format_rows
from nanobotd.cli.runtext import detail_lines
from nanobotd.cli.waiting import fetch_run

SESSION_COLUMNS = [("WORKSPACE", "workspace"), ("KEY", "key"), ("MESSAGES", "messages"),
                   ("UNARCHIVED", "unarchived_messages"), ("TOKENS", "unarchived_tokens"),
                   ("AGENT_ARCH", "agent_archived"), ("DAEMON_ARCH", "daemon_archived"),
                   ("CORRUPT", "corrupt_lines"), ("UPDATED", "updated_at"), ("STATE", "state")]
TOKENS_NOTE = ("TOKENS: tokens of the UNARCHIVED messages only, as nanobotd counts them (the agent's prompt adds "
               "its system prompt and tools; `nanobotctl session KEY` shows the budget they are held to)")
ESTIMATED_COLUMNS = ("messages", "unarchived_messages", "unarchived_tokens")
ESTIMATED_NOTE = ("~: a long file seen the first time, its figures estimated from its size; its lines are read "
                  "when a job or a change needs them")
RUN_COLUMNS = [("RUN_ID", "run_id"), ("KIND", "kind"), ("WORKSPACE", "workspace"), ("SESSION", "session_key"),
               ("STATE", "state"), ("OUTCOME", "outcome"), ("STARTED", "started_at"), ("FINISHED", "finished_at")]


def sessions(invocation: Invocation) -> int:
    """Every tracked session, one row each, to see which ones are behind on archiving."""
    return invocation.answer(invocation.client.get("/v1/sessions"), _session_lines)


def _session_lines(data: Mapping[str, Any]) -> list[str]:
    scanning = data.get("scanning") or []
    notes = [f"scanning: the first scan of {', '.join(scanning)} is not done yet; more sessions may appear"
             ] if scanning else []
    rows = [_marked_estimates(row) for row in data.get("sessions") or []]
    lines = notes + format_rows(SESSION_COLUMNS, rows, "no sessions found yet" if scanning else "no sessions tracked")
    if any(row.get("estimated") for row in rows):
        lines.append(ESTIMATED_NOTE)
    return lines + [TOKENS_NOTE] if rows else lines


def _marked_estimates(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """A session held unread shows its counts with a ~: estimated from the file's bytes."""
    if not row.get("estimated"):
        return row
    return {**row, **{name: f"~{row.get(name)}" for name in ESTIMATED_COLUMNS}}


def session(invocation: Invocation) -> int:
    """One session in detail, keyed exactly as the agent names it (slashes and colons included)."""
    data = invocation.client.get(f"/v1/sessions/{quote(invocation.args.key, safe='')}")
    return invocation.answer(data, lambda data: format_fields(data.get("session") or {}))


def runs(invocation: Invocation) -> int:
    """Recent runs, newest first as the daemon orders them, to find a run id to inspect or restore."""
    args = invocation.args
    data = invocation.client.get("/v1/runs", {"kind": args.kind, "limit": args.limit, "all": args.all or None})
    return invocation.answer(data, _run_lines)


def _run_lines(data: Mapping[str, Any]) -> list[str]:
    hidden = data.get("hidden_unchanged") or 0
    lines = format_rows(RUN_COLUMNS, data.get("runs") or [], "no runs that changed anything" if hidden else "no runs")
    if hidden:
        lines.append(f"({hidden} run{'s' if hidden != 1 else ''} that changed nothing not shown: --all lists them; "
                     f"`nanobotctl observe` counts them)")
    return lines


def run(invocation: Invocation) -> int:
    """One run: what it did and changed, in words; --json keeps the whole manifest."""
    return invocation.answer(fetch_run(invocation, invocation.args.run_id),
                             lambda data: detail_lines(data.get("run") or {}))
