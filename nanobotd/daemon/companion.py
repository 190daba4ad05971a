"""Companion mode: beside an agent that archives by itself, nanobotd archives only what the agent lost.

The agent (nanobot 0.3.x) writes its own history entries: one from compacting in place comes just before its save moves
`last_archived`, one for `/new` just after the file is cut. So each new agent entry waits, unclaimed, until the tracker
sees a session's mark move (the entry was that compaction's) or its messages vanish (the entry archived them); messages
that vanished with no agent entry within the grace period are archived by nanobotd from the spool. An entry still
unclaimed after a full scan that saw neither is dropped: its compaction failed after writing it (the mark never
moved), and nanobot archives those messages again itself, so it must not be taken for a later cut's archive."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from loguru import logger

from nanobotd.daemon import indexing, runs
from nanobotd.daemon.core import Core
from nanobotd.daemon.workspace import Workspace
from nanobotd.memory.agent_history import HistoryFollower, is_agent_entry, is_truncated_raw, kept_of_cut
from nanobotd.memory.history import HistoryEntry, history_path, largest_cursor_in_file


@dataclass
class AgentArchive:
    """What one workspace's agent archived itself, and the cut sessions waiting for its entry."""

    follower: HistoryFollower
    unclaimed: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)
    cut_cursors: dict[str, int] = field(default_factory=dict)  # history's last cursor when a waiting cut was seen
    quiet_cursors: dict[str, int] = field(default_factory=dict)  # and at a session's last scan with neither
    rescued: dict[str, tuple[float, list[str]]] = field(default_factory=dict)
    checks: dict[str, asyncio.TimerHandle] = field(default_factory=dict)


def agent_archive(core: Core, workspace: Workspace) -> AgentArchive:
    """The workspace's companion state, created on first use (before the first scan) from the cursor remembered in
    the state DB, else from history's last cursor, saved at once: the agent's entries from then on are its own."""
    if workspace.agent_archive is None:
        rows = core.store.query("SELECT last_cursor FROM agent_history WHERE workspace=?", (workspace.name,))
        after = rows[0][0] if rows else largest_cursor_in_file(history_path(workspace.env.memory_dir))
        workspace.agent_archive = AgentArchive(HistoryFollower(workspace.env.memory_dir, after))
        if not rows:
            _save_cursor(core, workspace)
    return workspace.agent_archive


def _save_cursor(core: Core, workspace: Workspace) -> None:
    with core.store.transaction() as db:
        db.execute("INSERT OR REPLACE INTO agent_history (workspace, last_cursor) VALUES (?, ?)",
                   (workspace.name, workspace.agent_archive.follower.last_cursor))


def poll_agent_history(core: Core, workspace: Workspace) -> None:
    """Read the agent's new history entries; a late one for a session nanobotd rescued counts as twice."""
    archive = agent_archive(core, workspace)
    entries = [entry for entry in archive.follower.poll() if is_agent_entry(entry) and entry.session_key]
    for entry in entries:
        key = entry.session_key
        rescued = archive.rescued.pop(key, None)
        if rescued is not None and key not in archive.waiting and key in workspace.tracker.sessions:
            count = workspace.tracker.count_archived_twice(key, rescued[1])
            logger.warning("workspace {}: the agent archived session {} after nanobotd's rescue of {} message(s)",
                           workspace.name, key, count)
            continue
        archive.unclaimed.setdefault(key, []).append(entry)
    if entries:
        indexing.changed(core, workspace)  # the agent's entries are searchable memory too
        _save_cursor(core, workspace)


def session_scanned(core: Core, workspace: Workspace, key: str, *, mark_moved: bool, vanished: int,
                    tail_before: int = 0) -> None:
    """A scan of session *key* in companion mode: attribute the agent's entries, wait for cut messages."""
    archive = agent_archive(core, workspace)
    poll_agent_history(core, workspace)
    if mark_moved:
        if tail_before:
            workspace.learn_agent_base(tail_before)
        archive.unclaimed.pop(key, None)  # those entries were the agent's in-place compaction
        archive.rescued.pop(key, None)
        workspace.tracker.set_cycle(key, next_cycle=True)
    if vanished:
        if key not in archive.waiting:
            archive.waiting[key] = core.clock()
            archive.cut_cursors[key] = archive.follower.last_cursor
            workspace.tracker.set_cycle(key, next_cycle=True)
        settle(core, workspace, key)
    elif not mark_moved and key not in archive.waiting:
        # an entry read by the last such scan too: a compaction that failed after writing it (see the module's doc);
        # one read only now may belong to a save this scan has not read yet
        before = archive.quiet_cursors.get(key, 0)
        kept = [entry for entry in archive.unclaimed.pop(key, []) if entry.cursor > before]
        if kept:
            archive.unclaimed[key] = kept
        archive.quiet_cursors[key] = archive.follower.last_cursor


def settle(core: Core, workspace: Workspace, key: str) -> None:
    """Decide about session *key*'s vanished messages now, or look again when the grace period ends."""
    archive = agent_archive(core, workspace)
    if key not in archive.waiting:
        return
    poll_agent_history(core, workspace)
    entries = archive.unclaimed.get(key, [])
    # the agent writes its /new archive after the cut; an entry read with the cut may be an older one of a failed
    # compaction, so it is taken (the newest alone) only if none comes after the cut within the grace
    after_cut = [entry for entry in entries if entry.cursor > archive.cut_cursors[key]]
    vanished = workspace.tracker.vanished(key)  # digests: a /new of a long session cuts every message
    waited = core.clock() - archive.waiting[key]
    grace = workspace.settings.consolidation.agent_grace_seconds
    if waited < grace and vanished and not after_cut:
        _check_again(core, workspace, key, grace - waited)
        return
    archive.waiting.pop(key, None)
    archive.cut_cursors.pop(key, None)
    archive.unclaimed.pop(key, None)
    if after_cut or entries or not vanished:
        _agent_archived(core, workspace, key, after_cut or entries[-1:], vanished)
        return
    run_id = runs.submit(core, workspace, "consolidate", session_key=key, reason="rescue", vanished_only=True)
    archive.rescued[key] = (core.clock(), vanished)
    logger.info("workspace {}: no archive entry of the agent for {} within {:g}s; {} message(s) rescued by run {}",
                workspace.name, key, grace, len(vanished), run_id)


def _agent_archived(core: Core, workspace: Workspace, key: str, entries: list[HistoryEntry],
                    vanished: list[str]) -> None:
    """The agent archived the cut messages (*vanished*, their digests in order); only what its cut [RAW] entry
    dropped is archived by nanobotd (the messages' texts are read only to find that)."""
    if not vanished:
        return
    cut = next((entry for entry in entries if is_truncated_raw(entry.content)), None)
    kept = len(vanished)
    if cut is not None:  # how many the cut entry kept is found in their texts, and how much of the next one
        messages = [message for _, message, _ in workspace.tracker.pending(key, vanished_only=True)]
        vanished = [message.digest for message in messages]
        kept, held_chars = kept_of_cut(cut.content, [message.text for message in messages])
        if held_chars and kept < len(vanished):
            workspace.tracker.agent_held.setdefault(key, {})[vanished[kept]] = held_chars
    workspace.tracker.drop_agent_archived(key, vanished[:kept])
    if kept < len(vanished):
        dropped = vanished[kept:]
        run_id = runs.submit(core, workspace, "consolidate", session_key=key, reason="mend", vanished_only=True)
        logger.info("workspace {}: the agent's [RAW] entry for {} was cut; run {} archives the {} message(s) "
                    "it dropped", workspace.name, key, run_id, len(dropped))


def _check_again(core: Core, workspace: Workspace, key: str, delay: float) -> None:
    archive = agent_archive(core, workspace)
    handle = archive.checks.pop(key, None)
    if handle is not None:
        handle.cancel()
    loop = asyncio.get_running_loop()
    archive.checks[key] = loop.call_later(max(0.1, delay), settle, core, workspace, key)


def close(workspace: Workspace) -> None:
    """Cancel the pending grace checks of a workspace that is closing."""
    if workspace.agent_archive is not None:
        for handle in workspace.agent_archive.checks.values():
            handle.cancel()
