"""What the web page reads that the other endpoints do not give: the bootstrap files with their caps, the
daily notes there are, a page of the newest history entries, and the outcome series per day."""

from __future__ import annotations

import os
from datetime import datetime, time, timedelta

from nanobotd import fsio
from nanobotd.api.app import Request
from nanobotd.config.paths import MEMORY_FILES
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import blocking, one_workspace
from nanobotd.daemon.handlers.search import query_date
from nanobotd.daemon.workspace import Workspace
from nanobotd.memory import historypage
from nanobotd.memory.dailynote import ARCHIVE_DIR_NAME, NoteError, note_date
from nanobotd.state import metrics

MAX_FILE_BYTES = 2 * 1024 * 1024  # a bootstrap file past this is shown cut (nanobot's cap is far below it)
DEFAULT_HISTORY_PAGE = 50
MAX_DAILY_DAYS = 90


async def memory_files(core: Core, request: Request) -> dict:
    """SOUL.md, USER.md and MEMORY.md as they are, sizes against context.max_chars, the days with a daily note, and with
    `day=YYYY-MM-DD` or `latest` that day's notes (/v1/recall reads all history: too slow for a page)."""
    workspace = one_workspace(core, request)
    caps = workspace.settings.context
    files = await blocking(core, bootstrap_files, workspace)
    notes = await blocking(core, note_days, workspace)
    answer = {"workspace": workspace.name, "files": files, "max_chars": caps.max_chars,
              "total_max_chars": caps.total_max_chars, "total_chars": sum(item["chars"] for item in files),
              "notes": notes}
    wanted = request.query.get("day")
    if wanted == "latest" and notes:
        answer["day"] = notes[0]["date"]
    elif wanted and wanted != "latest":
        answer["day"] = query_date(request, "day").isoformat()
    if answer.get("day"):
        day = answer["day"]
        answer["day_notes"] = await blocking(core, day_notes, workspace, [note for note in notes
                                                                          if note["date"] == day])
    return answer


async def history(core: Core, request: Request) -> dict:
    """The newest history entries, newest first; `before=CURSOR` gives the page after one ending there."""
    workspace = one_workspace(core, request)
    limit = request.query_int("limit", DEFAULT_HISTORY_PAGE, minimum=1, maximum=historypage.MAX_PAGE)
    before = request.query_int("before", None, minimum=1)
    entries = await blocking(core, historypage.newest_entries, workspace.env.memory_dir, limit, before)
    return {"workspace": workspace.name, "entries": [dict(entry.to_record(), cursor=entry.cursor)
                                                     for entry in entries],
            "next_before": entries[-1].cursor if len(entries) == limit else None}


async def daily(core: Core, request: Request) -> dict:
    """Per day of the last `days` (default 14): outcomes by kind, history entries written, the archived-twice and index
    size samples (none for a day the daemon was down); and each kind's newest outcome, telling how the LLM last went."""
    workspace = one_workspace(core, request)
    days = request.query_int("days", 14, minimum=1, maximum=MAX_DAILY_DAYS)
    now = core.clock()
    first = core.now().date() - timedelta(days=days - 1)
    since = datetime.combine(first, time()).timestamp()
    return {
        "workspace": workspace.name, "from": first.isoformat(),
        "outcomes": metrics.daily_outcomes(core.store, since=since, now=now, workspace=workspace.name),
        "history_entries": await blocking(core, historypage.entries_per_day, workspace.env.memory_dir,
                                                first.isoformat()),
        "last_outcomes": metrics.last_outcomes(core.store, workspace.name),
        "samples": metrics.daily_samples(core.store, workspace.name, first.isoformat()),
    }


def bootstrap_files(workspace: Workspace) -> list[dict]:
    """Each bootstrap file that exists: path, text and size in characters."""
    files = []
    for relative in MEMORY_FILES:
        path = workspace.settings.path / relative
        try:
            size = os.stat(path).st_size
            text = fsio.read_text_lossy(path, MAX_FILE_BYTES)
        except OSError:
            continue
        files.append({"path": relative, "text": text, "chars": len(text), "cut": size > MAX_FILE_BYTES})
    return files


def day_notes(workspace: Workspace, notes: list[dict]) -> list[dict]:
    """The text of each of *notes* (one day's active and archived note)."""
    memory_dir = workspace.env.memory_dir
    found = []
    for note in notes:
        relative = f"{ARCHIVE_DIR_NAME}/{note['date']}.md" if note["archived"] else f"{note['date']}.md"
        try:
            text = fsio.read_text_lossy(memory_dir / relative, MAX_FILE_BYTES)
        except OSError:
            continue
        found.append(dict(note, path=f"memory/{relative}", text=text))
    return found


def note_days(workspace: Workspace) -> list[dict]:
    """The days with a daily note, newest first, and whether the note was archived; by name only (cheap)."""
    memory_dir = workspace.env.memory_dir
    days = []
    for folder, archived in ((memory_dir, False), (memory_dir / ARCHIVE_DIR_NAME, True)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            try:
                days.append({"date": note_date(name).isoformat(), "archived": archived})
            except NoteError:
                continue
    return sorted(days, key=lambda item: item["date"], reverse=True)


ROUTES = [  # Read-only; file reads run on the executor, so a large file never stalls the event loop.
    ("GET", "/v1/memory-files", memory_files),
    ("GET", "/v1/history", history),
    ("GET", "/v1/metrics/daily", daily),
]
