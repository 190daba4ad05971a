"""`nanobotctl status`: the daemon and each workspace at a glance, nested figures as labelled lines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.cli.invocation import Invocation
from nanobotd.cli.render import aligned, format_cell, format_duration

Rows = list[tuple[str, str]]


def status(invocation: Invocation) -> int:
    """Daemon and per-workspace health: the first thing to look at when memory seems stale."""
    socket_path = invocation.client.socket_path
    return invocation.answer(invocation.client.get("/v1/status"), lambda data: status_lines(data, socket_path))


def status_lines(status: Mapping[str, Any], socket_path: Any) -> list[str]:
    """The daemon's line, then one block per workspace."""
    lines = [f"nanobotd {status.get('version', '?')}  pid {status.get('pid', '?')}  "
             f"up {format_duration(status.get('uptime_seconds'))}",
             f"socket {socket_path}"]
    if status.get("restart_needed"):
        lines.append(f"restart needed: {format_cell(status['restart_needed'])} changed since the start")
    for workspace in status.get("workspaces") or []:
        lines.append("")
        lines.extend(workspace_lines(workspace))
    return lines


def workspace_lines(workspace: Mapping[str, Any]) -> list[str]:
    """A header, then `label  text` rows; the search figures as their own labelled lines below `search`."""
    rows = _health_rows(workspace) + _job_rows(workspace.get("jobs") or {})
    search_details: Rows = []
    if "search" in workspace:
        search_row, search_details = search_rows(workspace["search"])
        rows.append(search_row)
    header = f"workspace {workspace.get('name', '?')}  ({format_cell(workspace.get('path'))})"
    if workspace.get("exists") is False:
        header += "  [MISSING: this folder does not exist; nothing is managed until it does]"
    if workspace.get("scanning"):
        header += "  [scanning: first scan not done yet]"
    return [header] + aligned(rows, "  ", " ") + aligned(search_details, "    ", " ")


def search_rows(search: Any) -> tuple[tuple[str, str], Rows]:
    """The `search` row, and one labelled row each for the index, its last refresh, pending changes and QMD."""
    if not isinstance(search, dict):
        return ("search", format_cell(search)), []
    rows: Rows = []
    builtin = search.get("builtin")
    if isinstance(builtin, dict):
        size = builtin.get("db_bytes")
        kib = f", {size // 1024} KiB" if isinstance(size, int) else ""
        rows.append(("index", f"{format_cell(builtin.get('units'))} units from {format_cell(builtin.get('files'))} "
                              f"files{kib}, refreshed {format_cell(builtin.get('last_refresh'))}"))
    refresh = search.get("last_refresh")
    if isinstance(refresh, dict):
        rows.append(("last refresh", f"{format_cell(refresh.get('files_checked'))} files checked, "
                                     f"{format_cell(refresh.get('files_reindexed'))} reindexed, "
                                     f"+{format_cell(refresh.get('units_added'))} "
                                     f"-{format_cell(refresh.get('units_removed'))} units "
                                     f"in {format_cell(refresh.get('seconds'))}s"))
    if search.get("pending_changes") is not None:
        rows.append(("pending", f"{format_cell(search['pending_changes'])} changed file(s) to index"))
    if search.get("refreshes") is not None:  # the index's share of the daemon's work since it started
        running = ", one running now" if search.get("refreshing") else ""
        rows.append(("refreshes", f"{format_cell(search['refreshes'])} since the start, "
                                  f"{format_cell(search.get('refresh_seconds'))}s in all{running}"))
    if isinstance(search.get("qmd"), dict):
        rows.extend(("qmd " + label.strip(), text) for label, text in _field_rows(search["qmd"]))
    return ("search", f"backend {format_cell(search.get('backend'))}"), rows


def _field_rows(data: Mapping[str, Any], prefix: str = "") -> Rows:
    rows: Rows = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            rows.extend(_field_rows(value, f"{prefix}{key} "))
        else:
            rows.append((f"{prefix}{key}", format_cell(value)))
    return rows


def _estimated_text(workspace: Mapping[str, Any]) -> str:
    estimated = workspace.get("sessions_estimated") or 0
    return (f" (~: {estimated} long session{'s' if estimated != 1 else ''} not read yet, estimated from their size)"
            if estimated else "")


def _health_rows(workspace: Mapping[str, Any]) -> Rows:
    watcher = workspace.get("watcher") or {}
    watcher_state = "healthy" if watcher.get("healthy") else "UNHEALTHY"
    candidates = [
        ("sessions", "sessions_dir", f"{format_cell(workspace.get('sessions_dir'))} "
                                     f"({format_cell(workspace.get('sessions_watched'))} watched)"),
        ("unarchived", "unarchived_messages", f"{format_cell(workspace.get('unarchived_messages'))} messages, "
                                              f"{format_cell(workspace.get('unarchived_tokens'))} tokens"
                                              + _estimated_text(workspace)),
        ("watcher", "watcher", f"{watcher_state} ({format_cell(watcher.get('mode'))}), "
                               f"last reconcile {format_cell(watcher.get('last_reconcile'))}"),
        ("llm", "llm_mode", _llm_text(workspace)),
        ("mode", "consolidation_mode", _mode_text(workspace)),
        ("budget", "budget", f"{format_cell(workspace.get('budget'))} tokens, flush at "
                             f"{format_cell(workspace.get('flush_threshold'))} "
                             f"({format_cell(workspace.get('budget_source'))})"),
        ("agent", "agent", _agent_text(workspace.get("agent") or {})),
        ("git", "git", _git_text(workspace.get("git"))),
    ]
    rows = [(label, text) for label, key, text in candidates if key in workspace]
    if workspace.get("scan_errors"):
        rows.insert(1, ("scans", _scan_failures_text(workspace)))
    if workspace.get("held_elsewhere"):
        rows.insert(0, ("lock", f"LEFT ALONE: {workspace['held_elsewhere']}"))
    return rows


def _scan_failures_text(workspace: Mapping[str, Any]) -> str:
    """Failed scans track nothing: said next to the sessions, with the last failure's words."""
    last = workspace.get("last_scan_error") or {}
    text = f"FAILING: {format_cell(workspace['scan_errors'])} failed since the start"
    if last:
        text += (f", last at {format_cell(last.get('at'))}: {format_cell(last.get('path'))}: "
                 f"{format_cell(last.get('error'))}")
    return text


def _job_rows(jobs: Mapping[str, Any]) -> Rows:
    rows = []
    for name, job in jobs.items():
        job = job if isinstance(job, dict) else {"state": job}
        if job.get("off"):
            rows.append((name, f"off: {format_cell(job['off'])}"))
            continue
        last_run = f" (run {job['last_run_id']})" if job.get("last_run_id") else ""
        running = " (running)" if job.get("running") else ""
        text = f"last success {format_cell(job.get('last_success'))}{last_run}, next {format_cell(job.get('next_run'))}"
        rows.append((name, text + running))
    return rows


def _llm_text(workspace: Mapping[str, Any]) -> str:
    """The mode and model, and how the last call went: `online` alone says only that a model is set."""
    mode = workspace.get("llm_mode")
    if mode != "online":
        return format_cell(mode)
    text = f"online ({format_cell(workspace.get('llm_model'))})"
    last = workspace.get("llm_last_call")
    if not isinstance(last, dict):
        return f"{text}, no call yet"
    if last.get("ok"):
        return f"{text}, last call ok at {format_cell(last.get('at'))}"
    return f"{text}, LAST CALL FAILED at {format_cell(last.get('at'))}: {format_cell(last.get('error'))}"


def _git_text(git: Any) -> str:
    if not isinstance(git, dict):
        return format_cell(git)
    if not git.get("available"):
        return f"not used ({format_cell(git.get('reason'))})"
    dirty = git.get("dirty_tracked_files")
    state = f"uncommitted changes in {format_cell(dirty)}" if dirty else "clean"
    head = str(git.get("head") or "")[:12] or "no commits yet"
    return f"head {head}, {state}" + (f" ({format_cell(git['reason'])})" if git.get("reason") else "")


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
    return (f"window {agent.get('context_window')}, idle compaction "
            f"{agent.get('idle_compact_minutes')} min, {dream}, "
            f"{'MCP server ' + mcp if mcp else 'nanobotd MCP server not registered'} ({agent.get('config')})")
