"""The nightly lifecycle: age daily notes into the archive, expire old archived notes into history,
compact history.jsonl, and prune run backups past the restore window.

The plan is computed first and is the same list whether or not the run is a dry run; the real run then
executes it step by step, journaling before each step so a crash can be finished or undone.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.memory import history
from nanobotd.memory.dailynote import ARCHIVE_DIR_NAME, scan_notes
# One refusal type for every kind of restore, so the restore job catches a single exception.
from nanobotd.jobs.common import (
    EXPIRED,
    RestoreRefused,
    compact_history,
    compacted_entries_missing,
    compaction_candidates,
    describe_step,
    folder_size,
    refuse_if_expired,
    run_backup_dir,
)
from nanobotd.llm.client import LLMClient, LLMError, UsageMeter
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.state.store import OPEN_RUN_STATES, RUNS_DIR, RunRecord, StateStore
from nanobotd.tokens import count_tokens, encoding_name_for
from nanobotd.memory.transcript import PendingMessage, raw_entries

LIFECYCLE_KIND = "lifecycle"
SECONDS_PER_DAY = 86400
NOTES_BACKUP_DIR = "notes"
RUN_LIST_LIMIT = 1_000_000
SUMMARY_INPUT_RATIO = 0.4
SUMMARY_MAX_TOKENS = 4096
NOTHING = "(nothing)"
RAW_ENTRY_MARGIN = 400

SUMMARY_PROMPT = f"""You compress an agent's expired daily notes into its long-term history; the notes are \
deleted afterwards. Keep every fact that could matter later (decisions, preferences, constraints, outcomes of \
work, questions left open) and drop chatter. Answer only with fact lines, one per line, each written as \
"- [mark] fact" where mark is one of permanent, durable, ephemeral, correction; give the date a fact is from \
when it matters. If nothing is worth keeping, answer exactly {NOTHING}."""




# -- plan ----------------------------------------------------------------------------------------------


def plan_lifecycle(ws: WorkspaceSettings, *, store: StateStore, now: datetime,
                   run_id: str | None = None) -> tuple[list[dict], list[dict]]:
    """The steps a lifecycle run would execute now, and the files it must leave alone (with reasons)."""
    memory_dir = ws.path / "memory"
    scan = scan_notes(memory_dir)
    settings = ws.lifecycle
    today = now.date()
    plan: list[dict] = []
    skipped = list(scan.skipped)
    expiring: list[tuple[str, int, int]] = []
    for note in scan.active:
        age = (today - note.day).days
        if age <= settings.active_days:
            continue
        source = _relative(note.path, ws.path)
        target = memory_dir / ARCHIVE_DIR_NAME / note.path.name
        if not scan.archive_usable:
            skipped.append({"path": source, "reason": "not archived: the archive folder is unusable"})
            continue
        if target.exists() or target.is_symlink():
            skipped.append({"path": source, "reason": "not archived: the archive already holds a note of that date"})
            continue
        plan.append({"action": "move", "from": source, "to": _relative(target, ws.path),
                     "bytes": note.size, "age_days": age})
        if age > settings.ttl_days:
            expiring.append((_relative(target, ws.path), note.size, age))
    for note in scan.archived:
        age = (today - note.day).days
        if age > settings.ttl_days:
            expiring.append((_relative(note.path, ws.path), note.size, age))
    if expiring:
        expiring.sort()
        plan.append({"action": "summarise", "notes": [path for path, _, _ in expiring],
                     "bytes": sum(size for _, size, _ in expiring)})
        plan.extend({"action": "delete", "path": path, "bytes": size, "age_days": age}
                    for path, size, age in expiring)
    plan.extend(_plan_compaction(memory_dir, settings.max_history_entries))
    plan.extend(_plan_pruning(ws, store, now, run_id))
    return plan, skipped


def _plan_compaction(memory_dir: Path, max_entries: int) -> list[dict]:
    cursors = compaction_candidates(memory_dir, max_entries)
    if not cursors:
        return []
    return [{"action": "compact_history", "count": len(cursors), "first": cursors[0], "last": cursors[-1],
             "keep": max_entries, "cursors": cursors}]


def _plan_pruning(ws: WorkspaceSettings, store: StateStore, now: datetime, run_id: str | None) -> list[dict]:
    cutoff = now.timestamp() - ws.lifecycle.restore_window_days * SECONDS_PER_DAY
    steps = []
    for run in reversed(store.list_runs(workspace=ws.name, limit=RUN_LIST_LIMIT)):
        if run.run_id == run_id or run.state in OPEN_RUN_STATES or run.started_at >= cutoff:
            continue
        folder = run_backup_dir(store, run.run_id)
        if folder.is_dir():
            steps.append({"action": "prune_backups", "run_id": run.run_id, "path": str(folder),
                          "bytes": folder_size(folder),
                          "age_days": int((now.timestamp() - run.started_at) // SECONDS_PER_DAY)})
    return steps








def _relative(path: Path, workspace: Path) -> str:
    return str(path.relative_to(workspace))


# -- summary of expiring notes ----------------------------------------------------------------------------


async def summarise_notes(notes: list[tuple[str, bytes]], *, llm: LLMClient, meter: UsageMeter,
                          raw_max_chars: int) -> tuple[list[str], dict]:
    """History entry contents for expiring notes: one LLM summary per batch that fits the context window,
    and [RAW] entries (split, never cut) when offline, when the LLM fails, or for a note too big to send."""
    texts = [(path, data.decode("utf-8", errors="replace")) for path, data in notes]
    summary = {"notes": len(texts), "llm_batches": 0, "raw_notes": 0, "reason": ""}
    if llm.offline:
        summary.update(raw_notes=len(texts), reason="offline")
        return raw_note_entries(texts, raw_max_chars), summary
    encoding = encoding_name_for(llm.settings.model)
    budget = int(llm.settings.context_window * SUMMARY_INPUT_RATIO) - count_tokens(SUMMARY_PROMPT, encoding) - 64
    contents: list[str] = []
    for batch, fits in note_batches(texts, budget, encoding):
        facts = await _summarise_batch(batch, llm, meter, summary) if fits else None
        if not fits:
            summary["reason"] = "a note is too large to summarise"
        if facts is None:
            contents.extend(raw_note_entries(batch, raw_max_chars))
            summary["raw_notes"] += len(batch)
        elif facts != NOTHING:
            contents.extend(summary_entries(batch, facts))
    return contents, summary


async def _summarise_batch(batch: list[tuple[str, str]], llm: LLMClient, meter: UsageMeter,
                           summary: dict) -> str | None:
    body = "\n\n".join(f"=== {path} ===\n{text}" for path, text in batch)
    request = [{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": body}]
    try:
        reply = await llm.complete(request, max_tokens=SUMMARY_MAX_TOKENS, temperature=0.0)
    except LLMError as exc:
        meter.add_error(exc)
        summary["reason"] = f"LLM failed: {exc}"
        return None
    meter.add(reply)
    facts = history.THINK_BLOCK.sub("", reply.content).strip()
    if not facts:
        summary["reason"] = "LLM gave an empty summary"
        return None
    summary["llm_batches"] += 1
    return facts


def note_batches(texts: list[tuple[str, str]], budget: int, encoding: str) -> list[tuple[list, bool]]:
    """Consecutive notes grouped to fit *budget* tokens; a note over the budget alone is (note, False)."""
    batches: list[tuple[list, bool]] = []
    current: list[tuple[str, str]] = []
    used = 0
    for path, text in texts:
        cost = count_tokens(text, encoding) + 16
        if cost > budget:
            batches.append(([(path, text)], False))
            continue
        if current and used + cost > budget:
            batches.append((current, True))
            current, used = [], 0
        current.append((path, text))
        used += cost
    if current:
        batches.append((current, True))
    return batches


def summary_entries(batch: list[tuple[str, str]], facts: str) -> list[str]:
    """The summary of a batch as history entries, each under the hard cap."""
    days = [Path(path).stem for path, _ in batch]
    header = f"Archived daily notes {days[0]} to {days[-1]} ({len(days)} notes), summarised before deletion:"
    room = history.ENTRY_HARD_CAP - len(header) - 64
    lines = [line[start:start + room] for line in facts.splitlines() for start in range(0, max(len(line), 1), room)]
    entries: list[list[str]] = [[]]
    size = 0
    for line in lines:
        if entries[-1] and size + len(line) + 1 > room:
            entries.append([])
            size = 0
        entries[-1].append(line)
        size += len(line) + 1
    total = len(entries)
    return [header + (f" (part {number} of {total})" if total > 1 else "") + "\n" + "\n".join(chunk)
            for number, chunk in enumerate(entries, start=1)]


def raw_note_entries(batch: list[tuple[str, str]], max_chars: int) -> list[str]:
    """Notes as [RAW] entries in nanobot's transcript format, one "message" per note, split and never cut."""
    messages = []
    for path, text in batch:
        # Split long notes at line ends ourselves, so a fact is never cut in two across entries.
        pieces = line_chunks(text, max_chars - RAW_ENTRY_MARGIN)
        for number, piece in enumerate(pieces, start=1):
            label = path if len(pieces) == 1 else f"{path} (part {number} of {len(pieces)})"
            messages.append(PendingMessage("", "note", Path(path).stem, f"{label}\n{piece}", 0, {}))
    return raw_entries(messages, max_chars)


def line_chunks(text: str, size: int) -> list[str]:
    """*text* cut at line ends into pieces of at most *size* chars (a longer single line is its own piece)."""
    pieces: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        if current and len(current) + len(line) > size:
            pieces.append(current)
            current = ""
        current += line
    if current or not pieces:
        pieces.append(current)
    return pieces


# -- run -----------------------------------------------------------------------------------------------


async def run_lifecycle(ws: WorkspaceSettings, *, store: StateStore, llm: LLMClient, run_id: str,
                        now: datetime, dry_run: bool = False) -> dict:
    """Plan and (unless *dry_run*) execute the lifecycle; returns the manifest.

    A dry run only reads (files and the store) and returns {"plan", "skipped", ...}; the real run's
    manifest["executed"] is that same list of steps once they all succeed.
    """
    plan, skipped = plan_lifecycle(ws, store=store, now=now, run_id=run_id)
    manifest = {"workspace": ws.name, "workspace_path": str(ws.path), "now": now.isoformat(timespec="seconds"),
                "dry_run": dry_run, "plan": plan, "skipped": skipped}
    if dry_run:
        return manifest
    manifest.update(executed=[], pending=None, backups={}, history_added=[], history_removed=None, pruned=[],
                    summary=None, created_archive_dir=False, tokens={})
    meter = UsageMeter()
    executor = _StepExecutor(ws, store, llm, run_id, now, manifest, meter)
    try:
        for index, step in enumerate(plan):
            manifest["pending"] = index
            store.journal(run_id, manifest)
            await executor.execute(step)
            manifest["executed"].append(step)
            manifest["pending"] = None
    except Exception as exc:  # a step failed: report it, keep what is done (restorable), carry on living
        logger.exception("lifecycle of {} failed at step {}", ws.name, manifest["pending"])
        manifest["error"] = f"{type(exc).__name__}: {exc}"
        return _finish(ws, store, run_id, manifest, meter, "error", manifest["error"])
    outcome, reason = _outcome(manifest)
    return _finish(ws, store, run_id, manifest, meter, outcome, reason)


def _outcome(manifest: dict) -> tuple[str, str]:
    if not manifest["executed"]:
        return "no_change", "nothing to do"
    summary = manifest.get("summary") or {}
    if summary.get("raw_notes"):
        return "raw_fallback", summary.get("reason", "")
    return "written", ""


def _finish(ws: WorkspaceSettings, store: StateStore, run_id: str, manifest: dict, meter: UsageMeter,
            outcome: str, reason: str) -> dict:
    usage = meter.to_json()
    manifest["tokens"] = usage
    manifest["reason"] = reason
    latency = sum(meter.latencies_ms) if meter.latencies_ms else None
    store.finish_run(run_id, state="failed" if outcome == "error" else "finished", outcome=outcome,
                     manifest=manifest)
    store.record_outcome(LIFECYCLE_KIND, ws.name, outcome, run_id=run_id, reason=reason,
                         tokens=usage["prompt_tokens"] + usage["completion_tokens"], latency_ms=latency)
    return manifest


class _StepExecutor:
    """Executes one planned step at a time, journaling what it is about to change first."""

    def __init__(self, ws: WorkspaceSettings, store: StateStore, llm: LLMClient, run_id: str, now: datetime,
                 manifest: dict, meter: UsageMeter):
        self.ws, self.store, self.llm, self.run_id, self.now = ws, store, llm, run_id, now
        self.manifest, self.meter = manifest, meter
        self.memory_dir = ws.path / "memory"

    async def execute(self, step: dict) -> None:
        """Run one step of the plan."""
        action = step["action"]
        if action == "summarise":
            await self.summarise(step)
        else:
            getattr(self, action)(step)

    def move(self, step: dict) -> None:
        """Move a note into the archive (a rename needs no backup: the manifest says where it went)."""
        source, target = self.ws.path / step["from"], self.ws.path / step["to"]
        if not source.is_file() or target.exists() or target.is_symlink():
            raise RuntimeError(f"cannot move {step['from']} to {step['to']}: the files changed since planning")
        if not target.parent.exists():
            self.manifest["created_archive_dir"] = True
            self.store.journal(self.run_id, self.manifest)
            target.parent.mkdir(mode=0o755)
            fsio.fsync_dir(target.parent.parent)
        os.rename(source, target)
        fsio.fsync_dir(target.parent)
        fsio.fsync_dir(source.parent)

    async def summarise(self, step: dict) -> None:
        """Write the expiring notes into history, journaling the cursors before the append."""
        notes = [(path, (self.ws.path / path).read_bytes()) for path in step["notes"]]
        contents, summary = await summarise_notes(notes, llm=self.llm, meter=self.meter,
                                                  raw_max_chars=self.ws.consolidation.raw_max_chars)
        self.manifest["summary"] = summary

        def journal_cursors(cursors: list[int]) -> None:
            """Record the cursors before any byte is appended."""
            self.manifest["history_added"] = cursors
            self.store.journal(self.run_id, self.manifest)

        written = history.append_entries(self.memory_dir, [(content, None) for content in contents], self.now,
                                         before_write=journal_cursors)
        self.manifest["history_added"] = [entry.cursor for entry in written]

    def delete(self, step: dict) -> None:
        """Delete an expired note after copying it into the run folder."""
        path = self.ws.path / step["path"]
        data = path.read_bytes()
        backup = self.store.run_dir(self.run_id) / NOTES_BACKUP_DIR / Path(step["path"]).name
        fsio.atomic_write(backup, data, mode=0o600)
        self.manifest["backups"][step["path"]] = {"backup": str(backup), "mode": path.stat().st_mode & 0o7777,
                                                  "bytes": len(data)}
        self.store.journal(self.run_id, self.manifest)
        path.unlink()
        fsio.fsync_dir(path.parent)

    def compact_history(self, step: dict) -> None:
        """Remove the planned, already dreamt entries, saving them in the run folder first."""

        def journal_removal(removal: dict) -> None:
            self.manifest["history_removed"] = removal
            self.store.journal(self.run_id, self.manifest)

        compact_history(self.memory_dir, self.store.run_dir(self.run_id), step["cursors"], journal_removal)

    def prune_backups(self, step: dict) -> None:
        """Delete an old run's backup folder, marking that run expired first."""
        target = self.store.get_run(step["run_id"])
        self.manifest["pruned"].append({"run_id": step["run_id"], "path": step["path"], "bytes": step["bytes"]})
        self.store.journal(self.run_id, self.manifest)
        if target is not None:
            self.store.journal(target.run_id, {**target.manifest, EXPIRED: True, "expired_by": self.run_id})
        shutil.rmtree(step["path"], ignore_errors=True)


# -- restore -------------------------------------------------------------------------------------------


def restore_lifecycle_run(run: RunRecord, *, store: StateStore, dry_run: bool) -> dict:
    """Undo a lifecycle run: move notes back, recreate deleted notes byte-identical from backups, drop the
    summary entries it wrote and put compacted history entries back. Raises RestoreRefused.

    Returns {"run_id", "plan": [lines], "files": [paths that change]}; pruned backups cannot come back.
    """
    if run.kind != LIFECYCLE_KIND:
        raise RestoreRefused(f"run {run.run_id} is a {run.kind} run, not a lifecycle run")
    refuse_if_expired(run)
    manifest = run.manifest
    if manifest.get("dry_run") or "workspace_path" not in manifest:
        # Interrupted before its first journal entry: it changed nothing.
        return {"run_id": run.run_id, "plan": [f"lifecycle run {run.run_id} changed nothing; nothing to restore"],
                "files": []}
    workspace = Path(manifest["workspace_path"])
    steps = list(manifest.get("executed") or [])
    pending = manifest.get("pending")
    if isinstance(pending, int) and pending < len(manifest.get("plan") or []):
        steps.append(manifest["plan"][pending])  # interrupted: its undo is written to be harmless if it never ran
    _check_backups(run, steps)
    undo = _Undo(workspace, manifest)
    for step in reversed(steps):
        getattr(undo, "undo_" + step["action"])(step)
    if manifest.get("created_archive_dir"):
        undo.remove_archive_dir_if_empty()
    if not undo.plan:
        undo.plan.append(f"lifecycle run {run.run_id} changed nothing; nothing to restore")
    if not dry_run:
        for action in undo.actions:
            action()
    return {"run_id": run.run_id, "plan": undo.plan, "files": sorted(set(undo.files))}


def _check_backups(run: RunRecord, steps: list[dict]) -> None:
    manifest = run.manifest
    needed = []
    for step in steps:
        if step["action"] == "delete" and step["path"] in manifest.get("backups", {}):
            needed.append(manifest["backups"][step["path"]]["backup"])
        if step["action"] == "compact_history" and manifest.get("history_removed"):
            needed.append(manifest["history_removed"]["backup"])
    missing = [path for path in needed if not Path(path).is_file()]
    if missing:
        raise RestoreRefused(f"run {run.run_id} cannot be restored: backup {missing[0]} is missing")


class _Undo:
    """Collects the plan lines and the actions that undo a lifecycle run, newest step first."""

    def __init__(self, workspace: Path, manifest: dict):
        self.workspace = workspace
        self.manifest = manifest
        self.memory_dir = workspace / "memory"
        self.plan: list[str] = []
        self.files: list[str] = []
        self.actions: list = []

    def undo_prune_backups(self, step: dict) -> None:
        """Pruned backups are gone for good; say so."""
        self.plan.append(f"backups of run {step['run_id']} were pruned; they cannot come back")

    def undo_compact_history(self, step: dict) -> None:
        """Put the compacted entries back in cursor order."""
        entries = compacted_entries_missing(self.memory_dir, self.manifest.get("history_removed"))
        if not entries:
            return
        self.plan.append(f"put {len(entries)} compacted entries back into memory/history.jsonl")
        self.files.append(str(history.history_path(self.memory_dir)))
        self.actions.append(lambda: history.insert_entries(self.memory_dir, entries))

    def undo_delete(self, step: dict) -> None:
        """Recreate a deleted note byte-identical, unless something took its place since."""
        backup = self.manifest.get("backups", {}).get(step["path"])
        if backup is None:
            return  # interrupted before its backup existed, so before the delete
        path = self.workspace / step["path"]
        data = Path(backup["backup"]).read_bytes()
        if path.exists() or path.is_symlink():
            same = path.is_file() and not path.is_symlink() and path.read_bytes() == data
            self.plan.append(f"{step['path']} is {'already back' if same else 'there again with other content'};"
                             " left as is")
            return
        self.plan.append(f"recreate {step['path']} ({len(data)} bytes) from {backup['backup']}")
        self.files.append(str(path))
        self.actions.append(lambda: fsio.atomic_write(path, data, mode=backup["mode"]))

    def undo_summarise(self, step: dict) -> None:
        """Remove the summary entries the run wrote."""
        cursors = set(self.manifest.get("history_added") or [])
        if not cursors:
            return
        self.plan.append(f"remove the {len(cursors)} summary entries (cursors {min(cursors)}-{max(cursors)})"
                         " from memory/history.jsonl")
        self.files.append(str(history.history_path(self.memory_dir)))
        self.actions.append(lambda: history.rewrite_history(self.memory_dir, lambda e: e.cursor not in cursors))

    def undo_move(self, step: dict) -> None:
        """Move an archived note back where it was."""
        source, target = self.workspace / step["from"], self.workspace / step["to"]
        # Deletes are undone first (newest step first), so a note moved and expired in one run is back here.
        will_exist = any(str(target) == path for path in self.files)
        if source.exists() or source.is_symlink():
            self.plan.append(f"{step['from']} exists again; {step['to']} left in the archive")
            return
        if not (target.is_file() or will_exist):
            self.plan.append(f"{step['to']} is gone; nothing to move back")
            return
        self.plan.append(f"move {step['to']} back to {step['from']}")
        self.files.extend([str(target), str(source)])
        self.actions.append(lambda: _move_back(target, source))

    def remove_archive_dir_if_empty(self) -> None:
        """Drop the archive folder the run created once the notes it holds have moved back."""
        archive = self.memory_dir / ARCHIVE_DIR_NAME
        moved_out = {path for path in self.files if Path(path).parent == archive}
        try:
            left = {str(path) for path in archive.iterdir()} - moved_out
        except (FileNotFoundError, NotADirectoryError):
            return
        if not left and not archive.is_symlink():
            self.plan.append("remove the memory/archive folder the run created (empty again)")
            self.actions.append(lambda: _remove_empty_dir(archive))


def _move_back(target: Path, source: Path) -> None:
    os.rename(target, source)
    fsio.fsync_dir(source.parent)
    fsio.fsync_dir(target.parent)


def _remove_empty_dir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        return  # something arrived meanwhile: keep the folder
    fsio.fsync_dir(folder.parent)
