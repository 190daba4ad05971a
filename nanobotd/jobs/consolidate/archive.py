"""Consolidation: archive the oldest unarchived messages of a session into history.jsonl.

Write-ahead: each chunk's planned cursors (with a hash of their content) are journalled under the history lock before
the append, and its messages backed up in the run folder, so after a crash `recover_consolidation` finishes or rolls
back every chunk and each message ends archived exactly once or still in the spool. A chunk's record is a step of its
own (state.runsteps) beside the manifest's head, never journalled with every chunk before it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from loguru import logger

from nanobotd.jobs.consolidate.appending import (
    PendingMarks,
    append_group,
    backup_path,
    journal_records,
    manifest_head,
    raw_summary,
    record_outcomes,
)
from nanobotd.jobs.consolidate.asread import ArchivingRead
from nanobotd.jobs.consolidate.chunks import Chunk, ChunkLoads, plan_run
from nanobotd.jobs.consolidate.prompt import NOTHING, archive_messages, parse_summary
from nanobotd.jobs.env import JobEnv, note_progress
from nanobotd.jobs.errors import RestoreRefused
from nanobotd.jobs.runfiles import RESTORE_STEP_KEY
from nanobotd.llm.failures import LLMError
from nanobotd.llm.reply import UsageMeter
from nanobotd.memory import history
from nanobotd.memory.transcript import raw_entries, transcript
from nanobotd.sessions.session import digests_in
from nanobotd.state.store import RunRecord
from nanobotd.tokens import count_tokens, encoding_name_for
from nanobotd.tuning import APPEND_GROUP_CHUNKS, APPEND_GROUP_TOKENS, PROMPT_OVERHEAD_TOKENS

NOTHING_LEFT_REASON = "nothing unarchived to archive"
OVER_WINDOW_REASON = "the chunk, counted exactly, does not fit one request"


async def summarize_chunk(env: JobEnv, chunk: Chunk, session_key: str,
                          usage: UsageMeter) -> tuple[str, list[str], str]:
    """(outcome, entry contents, reason): summarized | nothing | raw_fallback, with why it fell back."""
    settings = env.settings.consolidation
    if chunk.oversized or env.llm.offline:
        return raw_summary(env, chunk)
    # the plan's sizes are the tracker's estimates: a chunk an LLM must receive is counted exactly, once
    text, max_tokens = transcript(chunk.messages), min(env.settings.llm.max_tokens, 4096)
    chunk.counted = await asyncio.to_thread(count_tokens, text, encoding_name_for(env.settings.llm.model))
    if chunk.counted > env.settings.llm.context_window - max_tokens - PROMPT_OVERHEAD_TOKENS:
        return "raw_fallback", raw_entries(chunk.messages, settings.raw_max_chars), OVER_WINDOW_REASON
    try:
        reply = await env.llm.complete(archive_messages(text, session_key), max_tokens=max_tokens)
        usage.add(reply)
    except LLMError as exc:
        usage.add_error(exc)
        logger.warning("consolidation of {}: LLM failed ({}); archiving raw", session_key, exc)
        return "raw_fallback", raw_entries(chunk.messages, settings.raw_max_chars), f"LLM failed: {exc}"
    summary = None
    if reply.finish_reason not in ("length",) and not reply.tool_calls:
        summary = parse_summary(reply.content, settings.summary_max_chars)
    if summary is None:
        reason = f"unusable answer (finish={reply.finish_reason}, tool_calls={len(reply.tool_calls)})"
        logger.warning("consolidation of {}: {}; archiving raw", session_key, reason)
        return "raw_fallback", raw_entries(chunk.messages, settings.raw_max_chars), reason
    if summary == NOTHING:
        return "nothing", [], ""
    return "summarized", [summary], ""


async def consolidate_session(env: JobEnv, session_key: str, run_id: str, *, reason: str,
                              vanished_only: bool = False) -> dict:
    """Archive a session's unarchived messages (all of them, or down to the target for "budget"). A session held unread
    is read first, off the event loop; without an LLM, archived as it is read (jobs.consolidate.asread)."""
    manifest: dict = {"session": session_key, "reason": reason, "chunks": [], "cursors": []}
    usage = UsageMeter()
    session = env.tracker.sessions.get(session_key)
    if session is not None and session.unread:
        if env.llm.offline and not vanished_only:
            outcomes = await _archive_as_read(env, session_key, run_id, manifest, reason, usage)
            if outcomes is not None:
                env.faults.reach("consolidate.read")
                return _finish(env, session_key, run_id, manifest, outcomes, usage)
        await asyncio.to_thread(env.tracker.read_unread, session_key)
    chunks = plan_run(env, session_key, reason, vanished_only=vanished_only)
    if vanished_only:
        manifest["vanished_only"] = True
    if not chunks:
        return _finish(env, session_key, run_id, manifest, [], usage)
    outcomes = []
    marks = PendingMarks(env, session_key, run_id, manifest)
    offline = env.llm.offline  # every chunk archived raw as read: read (and backed up) a group ahead
    loads = ChunkLoads(env, session_key, chunks, ahead=APPEND_GROUP_CHUNKS if offline else 1,
                       backups=(lambda number: backup_path(env, run_id, number)) if offline else None)
    try:
        number = 0
        while number < len(chunks):
            group, number = await _take_group(env, loads, chunks, number)
            if not group:
                continue
            note_progress(manifest, "archiving", group[0][0], len(chunks))
            if not env.llm.offline and not group[0][1].oversized:
                await marks.commit()  # the LLM call takes a while: what reached history is marked first
                env.store.journal(run_id, manifest_head(manifest))  # and the run says it is waiting
            outcomes.extend(await archive_chunks(env, session_key, run_id, group, manifest, usage, marks))
            for _, chunk in group:
                chunk.release()
            if marks.due():
                await marks.commit()
    finally:
        loads.cancel()
        marks.commit_now()  # chunks in history are marked before the run ends, however it ends
    return _finish(env, session_key, run_id, manifest, outcomes, usage)


async def _archive_as_read(env: JobEnv, session_key: str, run_id: str, manifest: dict, reason: str,
                           usage: UsageMeter) -> list[str] | None:
    """Archive a session held unread as its copy is read (asread); its chunks' outcomes, None when it was read
    meanwhile."""
    reading = ArchivingRead(env, session_key, run_id, manifest, budget=reason == "budget", usage=usage)
    try:
        read = await asyncio.to_thread(env.tracker.read_archiving, session_key, reading)
    except asyncio.CancelledError:  # its thread goes on: it stops before its next change
        reading.stop()
        raise
    except BaseException:  # the pass ended: chunks in history are marked before the run ends, however it ended
        reading.marks.commit_now()
        raise
    return reading.outcomes if read else None


def _finish(env: JobEnv, session_key: str, run_id: str, manifest: dict, outcomes: list[str],
            usage: UsageMeter) -> dict:
    """Close the run: no_change when it archived no chunk, else its overall outcome, and a new compaction cycle."""
    if not outcomes:
        env.store.finish_run(run_id, state="finished", outcome="no_change", manifest=manifest)
        # counted as a pass, so the metrics see the runs `nanobotctl runs` hides
        env.store.record_outcome("consolidate", env.settings.name, "no_change", run_id=run_id,
                                 reason=NOTHING_LEFT_REASON)
        return manifest
    note_progress(manifest, "archived", len(outcomes), len(outcomes))
    env.tracker.set_cycle(session_key, next_cycle=True)
    overall = ("raw_fallback" if "raw_fallback" in outcomes else "summarized" if "summarized" in outcomes
               else "nothing")
    manifest["tokens"] = usage.to_json()
    env.store.finish_run(run_id, state="finished", outcome=overall, manifest=manifest)
    return manifest


def chunk_cursors(manifest: dict) -> list[int]:
    """The cursors of the entries a run's done chunks wrote, in order (what `cursors` lists once it finished)."""
    return [cursor for chunk in manifest.get("chunks") or [] if isinstance(chunk, dict) and chunk.get("done")
            for cursor in chunk.get("cursors") or ()]


async def _take_group(env: JobEnv, loads: ChunkLoads, chunks: list[Chunk],
                      number: int) -> tuple[list[tuple[int, Chunk]], int]:
    """Chunk *number* (none if all its messages are gone) and, without an LLM, the chunks after it up to
    APPEND_GROUP_CHUNKS and APPEND_GROUP_TOKENS, appended together (an append costs its syncs); and the next number."""
    if not await loads.take(number):
        return [], number + 1
    group = [(number, chunks[number])]
    tokens, following = chunks[number].planned_tokens, number + 1
    while (env.llm.offline and len(group) < APPEND_GROUP_CHUNKS and following < len(chunks)
           and tokens + chunks[following].planned_tokens <= APPEND_GROUP_TOKENS):
        if await loads.take(following):
            group.append((following, chunks[following]))
            tokens += chunks[following].planned_tokens
        following += 1
    return group, following


async def archive_chunks(env: JobEnv, session_key: str, run_id: str, group: list[tuple[int, Chunk]],
                         manifest: dict, usage: UsageMeter, marks: PendingMarks) -> list[str]:
    """Summarise *group*'s chunks (in order) and append their entries in one append, each chunk's backup and cursors
    journalled first so recovery can finish or roll back any a crash cut short; marks wait in *marks*."""
    summaries = [(number, chunk, *await summarize_chunk(env, chunk, session_key, usage)) for number, chunk in group]
    records = journal_records(env, run_id, summaries, manifest, usage)
    await asyncio.to_thread(append_group, env, session_key, run_id, records, manifest)
    return record_outcomes(env, run_id, records, manifest, usage, marks)


def read_chunk_backup(path: Path) -> list[tuple[str, dict, int]]:
    """(digest, record, tokens) of a chunk's messages, from its backup file."""
    result = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            result.append((item["digest"], item["record"], int(item.get("tokens", 0))))
    return result


def recover_consolidation(env: JobEnv, run: RunRecord) -> str:
    """Finish or roll back a consolidation run interrupted by a crash; returns the resulting outcome."""
    manifest = dict(run.manifest)
    # Only the cursors the interrupted chunks journalled matter: stream the history, keep the hashes of those.
    journalled = {cursor for chunk in manifest.get("chunks", []) if not chunk.get("done")
                  for cursor in chunk.get("cursors") or ()}
    present = {entry.cursor: history.content_hash(entry.content)
               for entry in (history.iter_entries(env.memory_dir) if journalled else ()) if entry.cursor in journalled}
    finished = rolled_back = 0
    for chunk in manifest.get("chunks", []):
        if chunk.get("done"):
            continue
        cursors, hashes = chunk.get("cursors"), chunk.get("hashes", [])
        if cursors is None:
            continue
        found = [cursor for cursor, digest in zip(cursors, hashes, strict=False)
                 if cursor in present and present[cursor] == digest]
        digests = [digest for digest, _, _ in read_chunk_backup(Path(chunk["backup"]))]
        if len(found) == len(cursors):
            env.tracker.mark_archived(run.session_key, digests, run.run_id)
            chunk["done"] = True
            finished += 1
        else:
            if found:
                history.remove_entries(env.memory_dir, lambda entry, gone=set(found): entry.cursor not in gone)
            chunk["rolled_back"] = True
            rolled_back += 1
    # chunks marked before the crash count too: their entries stay in history, and a restore undoes them
    kept = any(chunk.get("done") for chunk in manifest.get("chunks", []))
    if run.session_key in env.tracker.sessions:  # cut short as it read a held copy: what it did not archive is spooled
        env.tracker.read_unread(run.session_key)
    outcome = "recovered" if kept else "rolled_back"
    manifest["cursors"] = chunk_cursors(manifest)
    manifest["recovery"] = {"finished_chunks": finished, "rolled_back_chunks": rolled_back}
    if "error" in manifest:  # an exception ended it in the daemon, no crash: still a failure, its appends now marked
        env.store.finish_run(run.run_id, state="failed", outcome="error", manifest=manifest)
    else:
        env.store.finish_run(run.run_id, state="finished" if kept else "rolled_back", outcome=outcome,
                             manifest=manifest)
    return outcome


def restore_consolidation(env: JobEnv, run: RunRecord, *, dry_run: bool, restore_run_id: str | None = None) -> dict:
    """Undo an archive run: remove the entries it wrote and put its messages back in the spool (the entries of
    every done chunk, whether or not the run lived to list them under `cursors`), as one journalled step."""
    cursors = set(run.manifest.get("cursors", [])) | set(chunk_cursors(run.manifest))
    chunks = [chunk for chunk in run.manifest.get("chunks", []) if chunk.get("done")]
    hashes = {cursor: digest for chunk in chunks
              for cursor, digest in zip(chunk.get("cursors") or (), chunk.get("hashes") or (), strict=False)}
    removed = [entry.to_record() for entry in history.iter_entries(env.memory_dir)
               if entry.cursor in cursors and _written_by(entry, run.run_id, hashes)]
    cursors = {record["cursor"] for record in removed}
    plan = [f"remove history entries with cursors {sorted(cursors)}" if cursors else "no history entries to remove"]
    count = sum(chunk.get("count", 0) for chunk in chunks)
    plan.append(f"rewind the archive pointer of session {run.session_key}: {count} messages become unarchived")
    if run.manifest.get("vanished_only"):
        plan.append("they left the session file: the daemon archives them again after the grace period "
                    f"(at once: nanobotctl consolidate {run.session_key})")
    if dry_run:
        return {"plan": plan}
    step = {"op": "unarchive", "kind": "consolidate", "session": run.session_key, "run": run.run_id,
            "cursors": sorted(cursors), "backups": [chunk["backup"] for chunk in chunks],
            "removed_entries": removed, "plan": plan}
    return _journal_and_finish(env, restore_run_id, step)


def _written_by(entry: history.HistoryEntry, run_id: str, hashes: dict[int, str]) -> bool:
    """Whether history *entry*, at a cursor run *run_id* wrote, is still its entry: cursors start again at 1 when
    memory/ is deleted, and the entry another run (or the agent) wrote there since must stay."""
    if entry.span:
        return entry.span.get("run") == run_id
    return hashes.get(entry.cursor, history.content_hash(entry.content)) == history.content_hash(entry.content)


def reapply_consolidation(env: JobEnv, original: RunRecord, restore_run: RunRecord, *, restore_run_id: str | None,
                          dry_run: bool) -> dict:
    """Put back the entries a consolidation restore removed and re-mark their messages archived, in one journalled step;
    refused when a later run archived some of them already (they would be in history twice)."""
    records = restore_run.manifest.get("removed_entries", [])
    backups = [chunk["backup"] for chunk in original.manifest.get("chunks", []) if chunk.get("done")]
    digests = [digest for backup in backups for digest, _, _ in read_chunk_backup(Path(backup))]
    plan = [f"re-insert history entries with cursors {[record.get('cursor') for record in records]}",
            f"mark {len(digests)} messages of {original.session_key} archived again"]
    session = env.tracker.sessions.get(original.session_key)
    again = digests_in(env.store, "archived", session.session_id, digests) if session is not None else set()
    if again:
        reason = (f"{len(again)} of its {len(digests)} messages were archived again since, by a later run: "
                  f"re-inserting its entries would archive them twice (restore that later run first)")
        raise RestoreRefused(reason, plan=[*plan, reason])
    if dry_run:
        return {"plan": plan}
    step = {"op": "reapply", "kind": "consolidate", "session": original.session_key, "run": original.run_id,
            "entries": records, "backups": backups, "plan": plan}
    return _journal_and_finish(env, restore_run_id, step)


def _journal_and_finish(env: JobEnv, restore_run_id: str | None, step: dict) -> dict:
    """Journal *step* in the restore run before it changes anything, then take it: a crash anywhere after this
    is finished by the restore's recovery (finish_restore_step), so history and the spool never disagree."""
    if restore_run_id is not None:
        current = env.store.get_run(restore_run_id)
        env.store.journal(restore_run_id, dict(current.manifest if current else {}, **{RESTORE_STEP_KEY: step}))
    env.faults.reach("restore.journalled")
    return finish_restore_step(env, step)


def finish_restore_step(env: JobEnv, step: dict) -> dict:
    """Take a journalled restore step to its end; taking it again changes nothing more (a restart after a crash
    finishes it): history first (a cursor removed or inserted once), then the spool and archive marks."""
    records = []
    for backup in step["backups"]:
        records.extend(read_chunk_backup(Path(backup)))
    if step["op"] == "unarchive":
        cursors = set(step["cursors"])
        if cursors:
            history.remove_entries(env.memory_dir, lambda entry: entry.cursor not in cursors)
        env.faults.reach("restore.history_rewritten")
        env.tracker.unarchive(step["session"], step["run"], records)
        env.faults.reach("restore.spool_changed")
        return {"plan": step["plan"], "removed_entries": step["removed_entries"], "messages": len(records)}
    entries = [history.parse_entry(json.dumps(record)) for record in step["entries"]]
    entries = [entry for entry in entries if entry is not None]
    history.insert_entries(env.memory_dir, entries)
    env.faults.reach("restore.history_rewritten")
    env.tracker.mark_archived(step["session"], [digest for digest, _, _ in records], step["run"])
    env.faults.reach("restore.spool_changed")
    return {"plan": step["plan"], "reinserted": len(entries)}
