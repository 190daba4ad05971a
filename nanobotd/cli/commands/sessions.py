"""Commands that read the daemon's state: status, sessions, session, runs, run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from nanobotd.cli.invocation import Invocation
from nanobotd.cli.render import format_cell, format_duration, format_fields, format_rows, format_run

SESSION_COLUMNS = [("WORKSPACE", "workspace"), ("KEY", "key"), ("MESSAGES", "messages"),
                   ("UNARCHIVED", "unarchived_messages"), ("TOKENS", "unarchived_tokens"),
                   ("AGENT_ARCH", "agent_archived"), ("DAEMON_ARCH", "daemon_archived"),
                   ("CORRUPT", "corrupt_lines"), ("UPDATED", "updated_at"), ("STATE", "state")]
RUN_COLUMNS = [("RUN_ID", "run_id"), ("KIND", "kind"), ("WORKSPACE", "workspace"), ("SESSION", "session_key"),
               ("STATE", "state"), ("OUTCOME", "outcome"), ("STARTED", "started_at"), ("FINISHED", "finished_at")]


def status(invocation: Invocation) -> int:
    """Daemon and per-workspace health: the first thing to look at when memory seems stale."""
    socket_path = invocation.client.socket_path
    return invocation.answer(invocation.client.get("/v1/status"), lambda data: _status_lines(data, socket_path))


def sessions(invocation: Invocation) -> int:
    """Every tracked session, one row each, to see which ones are behind on archiving."""
    return invocation.answer(invocation.client.get("/v1/sessions"), _session_lines)


def _session_lines(data: Mapping[str, Any]) -> list[str]:
    scanning = data.get("scanning") or []
    notes = [f"scanning: the first scan of {', '.join(scanning)} is not done yet; more sessions may appear"
             ] if scanning else []
    return notes + format_rows(SESSION_COLUMNS, data.get("sessions") or [],
                               "no sessions found yet" if scanning else "no sessions tracked")


def session(invocation: Invocation) -> int:
    """One session in detail, keyed exactly as the agent names it (slashes and colons included)."""
    data = invocation.client.get(f"/v1/sessions/{quote(invocation.args.key, safe='')}")
    return invocation.answer(data, lambda data: format_fields(data.get("session") or {}))


def runs(invocation: Invocation) -> int:
    """Recent runs, newest first as the daemon orders them, to find a run id to inspect or restore."""
    data = invocation.client.get("/v1/runs", {"kind": invocation.args.kind, "limit": invocation.args.limit})
    return invocation.answer(data, lambda data: format_rows(RUN_COLUMNS, data.get("runs") or [], "no runs"))


def run(invocation: Invocation) -> int:
    """One run with its manifest: what it read, wrote and decided."""
    return invocation.answer(fetch_run(invocation, invocation.args.run_id),
                             lambda data: format_run(data.get("run") or {}))


def fetch_run(invocation: Invocation, run_id: str) -> dict:
    """The daemon's answer about one run; shared with the commands that wait for their run."""
    return invocation.client.get(f"/v1/runs/{quote(run_id, safe='')}")


def _status_lines(status: Mapping[str, Any], socket_path: Any) -> list[str]:
    lines = [f"nanobotd {status.get('version', '?')}  pid {status.get('pid', '?')}  "
             f"up {format_duration(status.get('uptime_seconds'))}",
             f"socket {socket_path}"]
    if status.get("restart_needed"):
        lines.append(f"restart needed: {format_cell(status['restart_needed'])} changed since the start")
    for workspace in status.get("workspaces") or []:
        lines.append("")
        lines.extend(_workspace_lines(workspace))
    return lines


def _workspace_lines(workspace: Mapping[str, Any]) -> list[str]:
    rows = _health_rows(workspace) + _job_rows(workspace.get("jobs") or {})
    if "search" in workspace:
        rows.append(("search", format_cell(workspace["search"])))
    width = max((len(label) for label, _ in rows), default=0)
    header = f"workspace {workspace.get('name', '?')}  ({format_cell(workspace.get('path'))})"
    if workspace.get("scanning"):
        header += "  [scanning: first scan not done yet]"
    return [header] + [f"  {label:<{width}}  {text}" for label, text in rows]


def _health_rows(workspace: Mapping[str, Any]) -> list[tuple[str, str]]:
    watcher = workspace.get("watcher") or {}
    watcher_state = "healthy" if watcher.get("healthy") else "UNHEALTHY"
    candidates = [
        ("sessions", "sessions_dir", f"{format_cell(workspace.get('sessions_dir'))} "
                                     f"({format_cell(workspace.get('sessions_watched'))} watched)"),
        ("unarchived", "unarchived_messages", f"{format_cell(workspace.get('unarchived_messages'))} messages, "
                                              f"{format_cell(workspace.get('unarchived_tokens'))} tokens"),
        ("watcher", "watcher", f"{watcher_state} ({format_cell(watcher.get('mode'))}), "
                               f"last reconcile {format_cell(watcher.get('last_reconcile'))}"),
        ("llm", "llm_mode", format_cell(workspace.get("llm_mode"))),
        ("mode", "consolidation_mode", _mode_text(workspace)),
        ("agent", "agent", _agent_text(workspace.get("agent") or {})),
        ("git", "git", format_cell(workspace.get("git"))),
    ]
    return [(label, text) for label, key, text in candidates if key in workspace]


def _job_rows(jobs: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for name, job in jobs.items():
        job = job if isinstance(job, dict) else {"state": job}
        running = " (running)" if job.get("running") else ""
        detail = {key: value for key, value in job.items() if key not in ("last_success", "next_run", "running")}
        text = f"last success {format_cell(job.get('last_success'))}, next {format_cell(job.get('next_run'))}"
        rows.append((name, text + running + (f", {format_cell(detail)}" if detail else "")))
    return rows


def _mode_text(workspace: Mapping[str, Any]) -> str:
    mode = workspace.get("consolidation_mode")
    twice = workspace.get("archived_twice", 0)
    if mode == "companion":
        return f"companion: the agent archives, nanobotd mends what it loses (archived twice: {twice})"
    return f"{format_cell(mode)}: nanobotd archives by budget and idle time (archived twice: {twice})"


def _agent_text(agent: Mapping[str, Any]) -> str:
    if not agent.get("config"):
        return "no nanobot config.json found (its defaults assumed)"
    if agent.get("error"):
        return f"config.json unusable: {agent['error']}"
    dream = (f"own dream every {agent.get('dream_interval_hours')} h" if agent.get("dream_enabled")
             else "own dream disabled")
    mcp = agent.get("nanobotd_mcp_server")
    return (f"window {agent.get('context_window')}, budget {agent.get('budget')}, idle compaction "
            f"{agent.get('idle_compact_minutes')} min, {dream}, "
            f"{'MCP server ' + mcp if mcp else 'nanobotd MCP server not registered'} ({agent.get('config')})")
