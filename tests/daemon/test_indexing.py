"""Index refreshes beside jobs that write memory: they wait for the job's end, never longer than changes may wait."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from nanobotd.daemon import indexing
from nanobotd.index.sources import SourceSet


class _Archiving:
    """A job queue with a consolidation of workspace "ws" running while *running* is true."""

    def __init__(self) -> None:
        self.running = False

    def running_in(self, workspace: str, kind: str) -> bool:
        return self.running and workspace == "ws" and kind == "consolidate"


def _workspace(debounce: float, refreshed: list) -> SimpleNamespace:
    loop = asyncio.get_running_loop()
    index = SimpleNamespace(refresh=lambda changed: refreshed.append((loop.time(), changed)) or {})
    return SimpleNamespace(name="ws", settings=SimpleNamespace(search=SimpleNamespace(debounce_seconds=debounce)),
                           pending_paths={}, pending_since=0.0, refresh_handle=None, refreshing=False, index=index,
                           qmd=None, refreshes=0, refresh_seconds=0.0, refresh_started=None, last_refresh=None)


async def _until(refreshed: list, count: int) -> None:
    for _ in range(500):
        if len(refreshed) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(refreshed)} refreshes, {count} awaited")


def test_a_refresh_waits_for_the_archive_run_and_at_most_as_long_as_changes_may_wait():
    async def scenario():
        refreshed: list = []
        queue = _Archiving()
        core = SimpleNamespace(queue=queue, executor=ThreadPoolExecutor(1))
        waiting = _workspace(1.0, refreshed)  # changes may wait 5 s
        queue.running = True
        indexing.changed(core, waiting, {Path("a.jsonl")})
        await asyncio.sleep(1.3)  # one debounce went by: the refresh found the archive running
        assert refreshed == [] and set(waiting.pending_paths) == {Path("a.jsonl")}
        ended = asyncio.get_running_loop().time()
        queue.running = False
        await _until(refreshed, 1)
        assert refreshed[0][0] >= ended and refreshed[0][1] == [Path("a.jsonl")]

        hurried = _workspace(0.1, refreshed)  # changes may wait 0.5 s
        queue.running = True
        changed = asyncio.get_running_loop().time()
        indexing.changed(core, hurried, {Path("b.jsonl")})
        await _until(refreshed, 2)
        assert refreshed[1][0] - changed >= 0.5 - 0.01 and queue.running, "refreshed beside the run, once due"
        core.executor.shutdown()

    asyncio.run(scenario())


def test_a_refresh_elsewhere_waits_only_its_debounce():
    async def scenario():
        refreshed: list = []
        queue = _Archiving()
        core = SimpleNamespace(queue=queue, executor=ThreadPoolExecutor(1))
        other = _workspace(0.1, refreshed)
        other.name = "other"
        queue.running = True
        indexing.changed(core, other, {Path("c.jsonl")})
        armed = other.refresh_handle
        await _until(refreshed, 1)
        assert other.refresh_handle is armed, "another workspace's run holds nothing back: the first timer refreshed"
        core.executor.shutdown()

    asyncio.run(scenario())


class _Running:
    """A job queue with a job of *kind* running in workspace "ws" while *running* is true."""

    def __init__(self, kind: str) -> None:
        self.kind, self.running = kind, False

    def running_in(self, workspace: str, kind: str) -> bool:
        return self.running and workspace == "ws" and kind == self.kind


def _memory_workspace(tmp_path: Path, refreshed: list, *, qmd: bool = False) -> SimpleNamespace:
    workspace = _workspace(0.1, refreshed)
    workspace.index.sources = SourceSet(tmp_path)
    workspace.qmd = SimpleNamespace(request_update=lambda: None) if qmd else None
    return workspace


def test_a_dreams_own_memory_write_and_its_end_refresh_the_index_once(tmp_path):
    async def scenario():
        refreshed: list = []
        queue = _Running("dream")
        core = SimpleNamespace(queue=queue, executor=ThreadPoolExecutor(1))
        workspace = _memory_workspace(tmp_path, refreshed)
        queue.running = True
        indexing.changed(core, workspace, {tmp_path / "memory" / "MEMORY.md"})  # the watcher saw it
        await asyncio.sleep(0.4)  # the dream commits to git, longer than the debounce
        assert refreshed == [], "the dream's end refreshes: its own write must not refresh before"
        queue.running = False
        indexing.changed(core, workspace)
        await _until(refreshed, 1)
        await asyncio.sleep(0.3)
        assert len(refreshed) == 1 and refreshed[0][1] is None
        core.executor.shutdown()

    asyncio.run(scenario())


def test_only_files_an_index_reads_are_memory_files(tmp_path):
    async def scenario():
        workspace = _memory_workspace(tmp_path, [])
        with_qmd = _memory_workspace(tmp_path, [], qmd=True)
        memory = tmp_path / "memory"
        for name in ("memory/MEMORY.md", "SOUL.md", "USER.md", "memory/2026-11-28.md", "memory/history.jsonl",
                     "memory/archive/2026-10-01.md"):
            assert indexing.is_memory_file(workspace, tmp_path / name), name
        for name in (".MEMORY.md.swp", "MEMORY.md~", "4913", ".history.lock", ".dream_cursor", "#MEMORY.md#"):
            assert not indexing.is_memory_file(with_qmd, memory / name), name
        assert not indexing.is_memory_file(workspace, memory / "projects.md")
        assert indexing.is_memory_file(with_qmd, memory / "projects.md"), "QMD's collection reads memory/*.md"
        assert not indexing.is_memory_file(with_qmd, tmp_path / "AGENTS.md")

    asyncio.run(scenario())


def test_a_memory_file_written_once_is_refreshed_while_a_session_keeps_changing(tmp_path):
    async def scenario():
        refreshed: list = []
        core = SimpleNamespace(queue=_Running("dream"), executor=ThreadPoolExecutor(1))
        workspace = _memory_workspace(tmp_path, refreshed)  # debounce 0.1 s; changes may wait 0.5 s
        indexing.changed(core, workspace, {tmp_path / "memory" / "MEMORY.md"})
        saves = 0
        while not refreshed and saves < 20:  # the agent saves its session every 20 ms, 0.4 s in all
            indexing.changed(core, workspace, {tmp_path / "sessions" / "cli_a.jsonl"})
            saves += 1
            await asyncio.sleep(0.02)
        assert refreshed and saves < 20, "the memory file, quiet for a debounce, did not wait for the session"
        assert tmp_path / "memory" / "MEMORY.md" in refreshed[0][1]
        core.executor.shutdown()

    asyncio.run(scenario())
