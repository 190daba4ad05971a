"""A workspace with daily notes of known ages and a dreamt history, an injected clock, and a lifecycle run
over them: the steps the lifecycle tests share."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

from nanobotd.config.schema import LifecycleSettings, LLMSettings, WorkspaceSettings
from nanobotd.jobs.lifecycle.run import run_lifecycle
from nanobotd.llm.client import LLMClient
from nanobotd.memory import history

NOW = datetime(2026, 6, 15, 4, 45)
OFFLINE = LLMClient(LLMSettings())


class Clock:
    """A settable clock for the run ledger."""

    def __init__(self, moment: datetime):
        self.value = moment.timestamp()

    def __call__(self) -> float:
        return self.value

    def set(self, moment: datetime) -> None:
        self.value = moment.timestamp()


def workspace(tmp_path: Path, **lifecycle) -> WorkspaceSettings:
    (tmp_path / "ws" / "memory").mkdir(parents=True, exist_ok=True)
    return WorkspaceSettings(path=tmp_path / "ws", name="main", lifecycle=LifecycleSettings(**lifecycle))


def write_note(ws: WorkspaceSettings, relative: str, extra: str = "") -> Path:
    path = ws.path / "memory" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    day = Path(relative).stem
    path.write_text(f"# {day}\n\n## Topics\n- worked on project {day}\n{extra}\n## Notes\nhand-written ✓\n")
    return path


def seed_history(ws: WorkspaceSettings, count: int, dream_cursor: int) -> None:
    memory = ws.path / "memory"
    history.append_entries(memory, [(f"- [durable] fact number {n}", "telegram:1") for n in range(1, count + 1)],
                           NOW - timedelta(days=1))
    (memory / history.DREAM_CURSOR_NAME).write_text(str(dream_cursor))


def tree(ws: WorkspaceSettings) -> dict[str, bytes]:
    """Every file under memory/ (the cursor file excluded: cursors are never reused, so it never goes back)."""
    memory = ws.path / "memory"
    return {str(path.relative_to(memory)): path.read_bytes() for path in sorted(memory.rglob("*"))
            if path.is_file() and path.name != history.CURSOR_NAME}


def lifecycle(ws, store, llm=OFFLINE, now=NOW, dry_run=False) -> tuple[str, dict]:
    run_id = store.create_run("lifecycle", ws.name)
    return run_id, asyncio.run(run_lifecycle(ws, store=store, llm=llm, run_id=run_id, now=now, dry_run=dry_run))


def standard_workspace(tmp_path) -> WorkspaceSettings:
    ws = workspace(tmp_path, max_history_entries=5)
    write_note(ws, "2026-06-14.md")             # 1 day: stays
    write_note(ws, "2026-06-08.md")             # 7 days: stays (not older than active_days)
    write_note(ws, "2026-06-07.md")             # 8 days: moves
    write_note(ws, "2026-01-10.md")             # 156 days: moves and expires in the same run
    write_note(ws, "archive/2026-03-17.md")     # 90 days: stays archived
    write_note(ws, "archive/2026-03-16.md")     # 91 days: expires
    seed_history(ws, count=12, dream_cursor=4)
    return ws
