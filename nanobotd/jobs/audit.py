"""The workspace audit: what the next lifecycle run would do, the state of memory, and what is wrong
with it, each problem paired with the command or edit that fixes it. Read-only."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from nanobotd.config.schema import WorkspaceSettings
from nanobotd.jobs.common import describe_step, folder_size, run_backup_dir
from nanobotd.memory import history
from nanobotd.memory.dailynote import scan_notes
from nanobotd.state.store import StateStore

RUN_LIST_LIMIT = 1_000_000
LIFECYCLE_COMMAND = "nanobotctl lifecycle"
LINES_SHOWN = 20
NOTE_FIXES = (
    ("symlink", "replace the symlink with a real folder or file, or move it out of memory/"),
    ("not a folder", "move the file away and let the next `nanobotctl lifecycle` create the folder"),
    ("impossible date", "rename it to the date it is really for (YYYY-MM-DD.md)"),
    ("not valid UTF-8", "re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"),
    ("no ## sections", "add a `## Topics` section to it, or move it out of memory/"),
    ("not a daily note", "rename it to YYYY-MM-DD.md or move it out of memory/"),
    ("not archived", f"fix the archive folder, then run `{LIFECYCLE_COMMAND}`"),
)


def audit_workspace(ws: WorkspaceSettings, *, store: StateStore, now: datetime, lifecycle_plan: list,
                    extra_state: dict) -> dict:
    """{"name", "plan", "plan_steps", "state", "problems": [{"problem", "fix"}]} for one workspace.

    "plan" holds the lifecycle dry-run steps as readable lines (files, sizes, ages), "plan_steps" the
    steps themselves. Changes nothing.
    """
    memory_dir = ws.path / "memory"
    scan = history.read_history(memory_dir)
    cursors = [entry.cursor for entry in scan.entries]
    largest = max(cursors, default=0)
    cursor_file = history.read_cursor_file(memory_dir / history.CURSOR_NAME)
    dream_cursor = history.read_dream_cursor(memory_dir)
    state = {
        "history_entries": len(scan.entries),
        "history_bytes": _size(history.history_path(memory_dir)),
        "largest_cursor": largest,
        "cursor_file": cursor_file,
        "dream_cursor": dream_cursor,
        "undreamt_entries": sum(1 for cursor in cursors if cursor > dream_cursor),
        **_backup_usage(ws, store),
        **extra_state,
    }
    problems = history_problems(scan, largest, cursor_file, dream_cursor)
    problems += note_problems(ws)
    problems += lifecycle_problems(ws, lifecycle_plan, now)
    plan = [step if isinstance(step, str) else describe_step(step) for step in lifecycle_plan]
    return {"name": ws.name, "plan": plan, "plan_steps": lifecycle_plan, "state": state, "problems": problems}


def history_problems(scan: history.HistoryScan, largest: int, cursor_file: int, dream_cursor: int) -> list[dict]:
    """Duplicate or out-of-order cursors, unparsable lines and cursor files out of step with the history.

    Gaps between cursors are normal (compaction and restores leave them) and are not reported.
    """
    problems = []
    lines_of = defaultdict(list)
    for entry in scan.entries:
        lines_of[entry.cursor].append(entry.line)
    for cursor, lines in sorted(lines_of.items()):
        if len(lines) > 1:
            problems.append({
                "problem": f"memory/history.jsonl holds cursor {cursor} more than once (lines {_lines(lines)})",
                "fix": f"keep one of lines {_lines(lines)} in memory/history.jsonl (merge their content by hand)",
            })
    backwards = [(previous, entry) for previous, entry in zip(scan.entries, scan.entries[1:], strict=False)
                 if entry.cursor < previous.cursor]
    if backwards:
        previous, entry = backwards[0]
        problems.append({
            "problem": f"memory/history.jsonl is out of order: cursor {entry.cursor} at line {entry.line}"
                       f" follows cursor {previous.cursor} at line {previous.line}"
                       f" (lines going backwards: {_lines([entry.line for _, entry in backwards])})",
            "fix": "sort the lines of memory/history.jsonl by cursor (keep each entry's cursor)",
        })
    if scan.bad_lines:
        problems.append({
            "problem": f"memory/history.jsonl has {len(scan.bad_lines)} unparsable line(s):"
                       f" {_lines(scan.bad_lines)}",
            "fix": "repair or delete those lines; until then nanobotd skips them and never rewrites them away",
        })
    allocated = max(largest, cursor_file)
    if dream_cursor > allocated:
        problems.append({
            "problem": f"memory/.dream_cursor is {dream_cursor}, ahead of the last allocated cursor {allocated}:"
                       " the next entries would never be dreamt",
            "fix": f"edit memory/.dream_cursor to {allocated}",
        })
    if cursor_file and cursor_file < largest:
        problems.append({
            "problem": f"memory/.cursor is {cursor_file}, behind the largest cursor in history.jsonl ({largest})",
            "fix": f"edit memory/.cursor to {largest}",
        })
    return problems


def note_problems(ws: WorkspaceSettings) -> list[dict]:
    """Daily notes and archive entries the lifecycle leaves alone, with how to make them usable."""
    problems = []
    for item in scan_notes(ws.path / "memory").skipped:
        fix = next((text for key, text in NOTE_FIXES if key in item["reason"]), "inspect it by hand")
        problems.append({"problem": f"{item['path']}: {item['reason']}", "fix": f"{item['path']}: {fix}"})
    return problems


def lifecycle_problems(ws: WorkspaceSettings, plan: list, now: datetime) -> list[dict]:
    """Work a nightly lifecycle should already have done (it missed at least one night)."""
    settings = ws.lifecycle
    overdue = [
        step for step in plan
        if (step.get("action") == "move" and step.get("age_days", 0) > settings.active_days + 1)
        or (step.get("action") == "delete" and step.get("age_days", 0) > settings.ttl_days + 1)
    ]
    if not overdue:
        return []
    return [{
        "problem": f"the lifecycle is behind: {len(overdue)} daily note step(s) are overdue"
                   f" as of {now.date().isoformat()}",
        "fix": f"run `{LIFECYCLE_COMMAND}` (and check the lifecycle schedule)",
    }]


def _backup_usage(ws: WorkspaceSettings, store: StateStore) -> dict:
    total, runs = 0, 0
    for run in store.list_runs(workspace=ws.name, limit=RUN_LIST_LIMIT):
        folder = run_backup_dir(store, run.run_id)
        if folder.is_dir():
            runs += 1
            total += folder_size(folder)
    return {"backup_bytes": total, "backup_runs": runs}


def _size(path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(str(number) for number in numbers[:LINES_SHOWN])
    return shown + (f" and {len(numbers) - LINES_SHOWN} more" if len(numbers) > LINES_SHOWN else "")
