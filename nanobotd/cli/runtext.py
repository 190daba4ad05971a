"""Runs as people read them (pure functions of GET /v1/runs/{id}): a summary when a run ends, `nanobotctl run`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.cli.render import aligned, format_cell, format_table

# (key in the run's "changes", label), in the order a reader cares about.
CHANGE_LABELS = (("entries_added", "history entries added"), ("entries_removed", "history entries removed"),
                 ("messages_archived", "messages archived"), ("messages_unarchived", "messages unarchived"),
                 ("bullets_added", "bullets added"), ("notes_moved", "notes moved"),
                 ("notes_deleted", "notes deleted"), ("backups_pruned", "run backups pruned"),
                 ("files_indexed", "files indexed"), ("units_indexed", "search units indexed"),
                 ("dream_cursor", "dream cursor"))
OPEN_STATES = ("queued", "started")
PHASES = {"queued": "queued", "started": "running", "running": "running", "waiting_for_llm": "waiting for an LLM slot"}


def summary_lines(run: Mapping[str, Any], extra_rows: list[tuple[str, str]] | None = None) -> list[str]:
    """What a run that just ended did: a headline, what it changed, and where to look further."""
    lines = [headline(run)]
    lines.extend(aligned(_context_rows(run) + change_rows(run) + (extra_rows or []), "  "))
    if (run.get("state") == "finished" and run.get("kind") in ("consolidate", "flush", "dream", "lifecycle")
            and change_rows(run) != [("changed", "nothing")]):
        lines.append(f"Details: nanobotctl run {run.get('run_id')}; undo: nanobotctl restore {run.get('run_id')}")
    elif run.get("run_id"):
        lines.append(f"Details: nanobotctl run {run.get('run_id')}")
    return lines


def headline(run: Mapping[str, Any]) -> str:
    """`restore r-1: restored in 0.04s` (or `failed (refused)`, or where an open run has got)."""
    name = f"{run.get('kind', 'run')} {run.get('run_id') or ''}".rstrip()
    state, outcome = run.get("state"), run.get("outcome")
    if state in OPEN_STATES:
        return f"{name}: {progress_text(run)}"
    took = f" in {format_seconds(run['duration_seconds'])}" if run.get("duration_seconds") is not None else ""
    if state == "finished":
        return f"{name}: {format_cell(outcome)}{took}"
    return f"{name}: {format_cell(state)} ({format_cell(outcome)}){took}"


def progress_text(run: Mapping[str, Any], elapsed: float | None = None, *, with_time: bool = True) -> str:
    """`running, archiving 2/5, 3.4s`: the phase, the job's step and (*with_time*) the time so far."""
    progress = run.get("progress") or {}
    parts = [PHASES.get(str(progress.get("phase") or run.get("state")), str(progress.get("phase") or "waiting"))]
    step = progress.get("step")
    if step:
        done, total = progress.get("done"), progress.get("total")
        count = f" {done + 1}/{total}" if isinstance(done, int) and isinstance(total, int) and done < total else ""
        parts.append(f"{format_cell(step)}{count}")
    seconds = elapsed if elapsed is not None else progress.get("elapsed_seconds")
    if seconds is not None and with_time:
        parts.append(format_seconds(seconds))
    return ", ".join(parts)


def change_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) for each thing the run changed; `changed: nothing` when it changed nothing."""
    changes = run.get("changes") or {}
    rows = [(label, format_cell(changes[key])) for key, label in CHANGE_LABELS if changes.get(key)]
    if changes.get("files"):
        rows.append(("files", ", ".join(changes["files"])))
    if changes.get("commits"):
        rows.append(("commits", ", ".join(str(sha)[:12] for sha in changes["commits"])))
    if not rows and run.get("state") == "finished":
        rows.append(("changed", "nothing"))
    return rows


def detail_lines(run: Mapping[str, Any]) -> list[str]:
    """`nanobotctl run RUN_ID`: who, when, how it went, what changed, and the kind's own details."""
    rows = [("kind", run.get("kind")), ("workspace", run.get("workspace")), ("session", run.get("session_key")),
            ("state", run.get("state")), ("outcome", run.get("outcome")), ("started", run.get("started_at")),
            ("finished", run.get("finished_at"))]
    if run.get("duration_seconds") is not None:
        rows.append(("took", format_seconds(run["duration_seconds"])))
    if run.get("state") in OPEN_STATES:
        rows.append(("progress", progress_text(run)))
    text_rows = [(label, format_cell(value)) for label, value in rows if value not in (None, "")]
    lines = [f"run {run.get('run_id')}"]
    lines.extend(aligned(text_rows + _context_rows(run) + change_rows(run), "  "))
    lines.extend(_kind_details(run))
    lines.append("(--json shows the whole manifest)")
    return lines


def format_seconds(seconds: Any) -> str:
    """0.043 -> '0.04s', 75 -> '1m 15s': run times read in the unit that fits."""
    if not isinstance(seconds, (int, float)):
        return format_cell(seconds)
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m {rest}s"


def _context_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = []
    if run.get("kind") == "restore" and run.get("target"):
        target_kind = f"{run['target_kind']} " if run.get("target_kind") else ""
        rows.append(("undid", f"{target_kind}run {run['target']}"))
    rows.extend((key, format_cell(run[key])) for key in ("trigger", "error", "reason") if run.get(key))
    return rows


def _kind_details(run: Mapping[str, Any]) -> list[str]:
    manifest = run.get("manifest") or {}
    kind = run.get("kind")
    if kind == "consolidate" and manifest.get("chunks"):
        chunks = manifest["chunks"]
        rows = [[index + 1, chunk.get("count"), chunk.get("tokens"), chunk.get("outcome"),
                 ", ".join(str(cursor) for cursor in chunk.get("cursors") or []) or None, chunk.get("fallback_reason")]
                for index, chunk in enumerate(chunks)]
        return ["  chunks:"] + [f"    {line}" for line in format_table(
            ["CHUNK", "MESSAGES", "TOKENS", "OUTCOME", "CURSORS", "WHY RAW"], rows)]
    if kind == "dream" and manifest.get("analysis"):
        return ["  analysis:"] + [f"    {format_cell(line)}" for line in manifest["analysis"]]
    if kind == "flush" and manifest.get("added_bullets"):
        return ["  added:"] + [f"    {section}: {format_cell(bullet)}"
                               for section, bullets in manifest["added_bullets"].items() for bullet in bullets]
    if kind in ("restore", "lifecycle") and (manifest.get("plan") or manifest.get("executed")):
        steps = manifest.get("plan") if kind == "restore" else manifest.get("executed")
        return ["  steps:"] + [f"    {_step_text(step)}" for step in steps]
    return []


def _step_text(step: Any) -> str:
    if not isinstance(step, dict):
        return format_cell(step)
    action = step.get("action", "?")
    target = step.get("to") or step.get("path") or step.get("run_id") or ""
    source = f"{step['from']} -> " if step.get("from") else ""
    return f"{action} {source}{target}".rstrip()
