"""The dream job: read new history entries, find what changed (phase 1), edit the memory files (phase 2).

Phase 2 edits staged copies; only a normally completed tool loop reaches the disk, in one journalled step
on the git thread: back up, write, advance `.dream_cursor`, commit `dream: ...` with the run trailer. A run
cut short at any instant is rolled back at the next start (`recover_dream_run`), so the same batch is
dreamt again. Restore and dream-log live in `restore.py`, which also holds the backup helpers used here.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.gitstore.repo import GitStoreError
from nanobotd.gitstore.store import CURSOR_FILE, GitStore
from nanobotd.jobs.common import compact_history, compaction_candidates
from nanobotd.jobs.dream import prompts
from nanobotd.jobs.dream.restore import BACKUP_DIR, digest, line_counts, roll_back, save_backup
from nanobotd.jobs.dream.tools import ALLOWED_FILES, TOOL_SCHEMAS, StagedFiles, ToolRefused
from nanobotd.llm.client import LLMClient
from nanobotd.llm.failures import LLMError
from nanobotd.llm.reply import LLMReply, UsageMeter
from nanobotd.memory.history import (
    DREAM_CURSOR_NAME,
    THINK_BLOCK,
    HistoryEntry,
    read_dream_cursor,
    read_history,
)
from nanobotd.state.store import RunRecord, StateStore

__all__ = ["DreamError", "DreamResult", "DreamRun", "dream_workspace", "recover_dream_run"]

KIND = "dream"
FINDING = re.compile(r"^\[(USER|SOUL|MEMORY)\]\s*(\S.*)$")
SKIP_LINE = "[SKIP]"
CHARS_PER_TOKEN = 4
BATCH_CONTEXT_SHARE = 0.4
ITERATION_BOUND = "iteration bound"
TOKEN_BUDGET = "token budget"


class DreamError(Exception):
    """The dream cannot complete; its message is the outcome's reason."""


@dataclass(frozen=True)
class DreamResult:
    """How a dream run ended, with its manifest."""

    run_id: str
    state: str
    outcome: str
    manifest: dict


async def dream_workspace(
    workspace: WorkspaceSettings,
    *,
    store: StateStore,
    llm: LLMClient,
    git: GitStore,
    run_id: str,
    clock: Callable[[], datetime] = datetime.now,
    max_history_entries: int | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> DreamResult:
    """Dream one batch of history into SOUL.md / USER.md / MEMORY.md for an already created run.

    Never raises for LLM, git or file trouble: the run ends failed with outcome "error" and the cursor
    unchanged. *on_stage* is called on the git thread at "applying", "files_written", "cursor_written"
    and "committed" (a test seam for crashes).
    """
    if max_history_entries is None:
        max_history_entries = workspace.lifecycle.max_history_entries
    dream = DreamRun(workspace, store, llm, git, run_id, clock, max_history_entries, on_stage)
    return await dream.run()


class DreamRun:
    """The state of one dream run; `run` on the event loop, `apply` on the git thread."""

    def __init__(self, workspace: WorkspaceSettings, store: StateStore, llm: LLMClient, git: GitStore,
                 run_id: str, clock: Callable[[], datetime], max_history_entries: int,
                 on_stage: Callable[[str], None] | None):
        self.workspace, self.store, self.llm, self.git = workspace, store, llm, git
        self.run_id, self.max_history_entries = run_id, max_history_entries
        self.on_stage = on_stage or (lambda stage: None)
        self.memory_dir = workspace.path / "memory"
        self.meter = UsageMeter()
        self.staged: StagedFiles | None = None
        self.manifest: dict = {
            "started_at": clock().isoformat(timespec="seconds"), "stage": "reading", "analysis": [],
            "entries": [], "cursor_before": None, "cursor_after": None, "files_changed": {}, "commit": None,
            "history_compacted": {"removed": 0, "backup": None}, "guard_rejections": [], "iterations": 0,
        }

    async def run(self) -> DreamResult:
        """Both phases, then the apply step; every failure becomes a finished run."""
        if self.llm.offline:
            return self.finish("finished", "skipped_offline", record=False)
        cursor = read_dream_cursor(self.memory_dir)
        self.manifest.update(cursor_before=cursor, cursor_after=cursor)
        char_budget = int(self.workspace.llm.context_window * CHARS_PER_TOKEN * BATCH_CONTEXT_SHARE)
        entries = await asyncio.to_thread(select_batch, self.memory_dir, cursor, self.workspace.dream.batch_entries,
                                          char_budget)
        if not entries:
            return self.finish("finished", "no_change")
        self.manifest["entries"] = [entries[0].cursor, entries[-1].cursor]
        try:
            self.staged = await asyncio.to_thread(StagedFiles, self.workspace.path)
            findings = await self.analyse(entries)
            if findings:
                self.manifest["stage"] = "editing"
                await self.edit(findings)
        except (LLMError, DreamError) as exc:
            logger.warning("dream {} of {} failed: {}", self.run_id, self.workspace.name, exc)
            return self.finish("failed", "error", reason=str(exc))
        except asyncio.CancelledError:
            self.finish("failed", "error", reason="cancelled")
            raise
        return await self.git.call(self.apply, entries[-1].cursor)

    # -- phase 1 -----------------------------------------------------------------------------------
    async def analyse(self, entries: list[HistoryEntry]) -> list[str]:
        """Ask which facts are new or conflicting; [SKIP] or no valid finding means nothing to edit."""
        self.manifest["stage"] = "analysing"
        messages = [
            {"role": "system", "content": prompts.ANALYSIS_SYSTEM},
            {"role": "user", "content": prompts.analysis_request(self.file_sections(), entries)},
        ]
        reply = await self.complete(messages)
        if reply.finish_reason == "length":
            raise DreamError("analysis cut off (finish_reason length)")
        if not reply.content.strip():
            raise DreamError("empty analysis")
        findings, skipped = parse_analysis(reply.content)
        self.manifest["analysis"] = findings or ([SKIP_LINE] if skipped else [])
        return findings

    # -- phase 2 -----------------------------------------------------------------------------------
    async def edit(self, findings: list[str]) -> None:
        """The bounded tool loop; ends normally only when the model answers without tool calls."""
        settings = self.workspace.dream
        messages = [
            {"role": "system", "content": prompts.EDIT_SYSTEM},
            {"role": "user", "content": prompts.edit_request(findings, self.file_sections())},
        ]
        for iteration in range(1, settings.max_iterations + 1):
            self.manifest["iterations"] = iteration
            reply = await self.complete(messages, tools=TOOL_SCHEMAS)
            if not reply.tool_calls:
                return
            messages.append(reply.assistant_message())
            for call in reply.tool_calls:
                result = self.staged.run(call.name, call.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if self.meter.prompt_tokens + self.meter.completion_tokens >= settings.token_budget:
                raise DreamError(TOKEN_BUDGET)
        raise DreamError(ITERATION_BOUND)

    async def complete(self, messages: list[dict], tools: list[dict] | None = None) -> LLMReply:
        """One LLM call, counted in the run's usage meter whether it succeeds or fails."""
        try:
            reply = await self.llm.complete(messages, tools=tools)
        except LLMError as exc:
            self.meter.add_error(exc)
            raise
        self.meter.add(reply)
        return reply

    def file_sections(self) -> list[str]:
        """The three memory files as the prompts show them (as they were when the run began)."""
        staged = self.staged
        return [prompts.format_file(path, staged.current.get(path), staged.unavailable.get(path))
                for path in ALLOWED_FILES]

    # -- the apply step (git thread) ---------------------------------------------------------------
    def apply(self, cursor_after: int) -> DreamResult:
        """Back up, journal, write, advance the cursor, commit, compact; roll back on any failure."""
        try:
            contents = self.final_contents()
            # Never move the cursor back, should another dreamer have advanced it meanwhile.
            cursor_after = max(cursor_after, read_dream_cursor(self.memory_dir))
            self.back_up(contents, cursor_after)
            self.journal("applying")
            self.on_stage("applying")
            if contents and self.git.available:
                self.git.snapshot_outside_edits(self.run_id)
            for path, text in contents.items():
                fsio.atomic_write(self.staged.checked_path(path), text, root=self.memory_dir.parent)
            self.on_stage("files_written")
            fsio.atomic_write(self.memory_dir / DREAM_CURSOR_NAME, str(cursor_after), root=self.memory_dir.parent)
            self.manifest["cursor_after"] = cursor_after
            self.on_stage("cursor_written")
            if contents and self.git.available:
                self.manifest["commit"] = self.git.commit(
                    [*contents, CURSOR_FILE], self.commit_summary(contents), self.run_id, notes=self.commit_notes())
            self.on_stage("committed")
            self.journal("committed")
        except (GitStoreError, DreamError, ToolRefused, OSError) as exc:
            logger.error("dream {} of {} could not apply its edits: {}", self.run_id, self.workspace.name, exc)
            try:
                roll_back(self.workspace.path, self.manifest)
            except OSError as rollback_error:
                # The run stays "applying" in the journal, so start-up recovery tries again.
                logger.error("rolling back dream {} failed: {}", self.run_id, rollback_error)
                raise
            self.manifest.update(cursor_after=self.manifest["cursor_before"], commit=None, rolled_back=True)
            return self.finish("failed", "error", reason=f"apply failed: {exc}")
        self.compact()
        return self.finish("finished", "written" if contents else "no_change")

    def compact(self) -> None:
        """Compact history.jsonl once the dream is committed; a failure is logged, the dream still stands."""

        def journal_removal(removal: dict) -> None:
            self.manifest["history_compacted"] = removal
            self.journal("compacting")

        try:
            cursors = compaction_candidates(self.memory_dir, self.max_history_entries)
            compact_history(self.memory_dir, self.store.run_dir(self.run_id), cursors, journal_removal)
        except (OSError, fsio.LockTimeout) as exc:
            logger.warning("history compaction after dream {} failed: {}", self.run_id, exc)

    def final_contents(self) -> dict[str, str]:
        """The edited texts; edits are replayed onto a file the agent changed during the run."""
        contents = {}
        for path, (base, text) in self.staged.changes().items():
            full = self.staged.checked_path(path)
            current = full.read_bytes() if full.exists() else None
            if current != base:
                try:
                    text = self.staged.replay(path, (current or b"").decode("utf-8"))
                except (ToolRefused, UnicodeDecodeError) as exc:
                    raise DreamError(f"{path} changed during the dream and the edits no longer apply") from exc
            contents[path] = text
        return contents

    def back_up(self, contents: dict[str, str], cursor_after: int) -> None:
        """Save the pre-run content of every file to be written into the run's folder, and plan the manifest."""
        backup_dir = self.store.run_dir(self.run_id) / BACKUP_DIR
        for path, text in contents.items():
            full = self.workspace.path / path
            before = full.read_bytes()
            added, removed = line_counts(before.decode("utf-8"), text)
            self.manifest["files_changed"][path] = {
                "added": added, "removed": removed, "backup": save_backup(backup_dir, path, before),
                "after_sha256": digest(text.encode("utf-8")),
            }
        cursor_path = self.memory_dir / DREAM_CURSOR_NAME
        cursor_bytes = cursor_path.read_bytes() if cursor_path.is_file() else None
        self.manifest["cursor_backup"] = save_backup(backup_dir, CURSOR_FILE, cursor_bytes)
        self.manifest["cursor_written"] = str(cursor_after)

    def commit_summary(self, contents: dict[str, str]) -> str:
        """The commit's first line after `dream: `."""
        count = len(self.manifest["analysis"])
        return f"update {', '.join(contents)} ({count} finding{'s' if count != 1 else ''})"

    def commit_notes(self) -> str:
        """The analysis and cursor move, for the commit body."""
        first, last = self.manifest["entries"]
        return "\n".join([
            "Analysis:", *self.manifest["analysis"], "",
            f"Dream cursor: {self.manifest['cursor_before']} -> {self.manifest['cursor_after']}"
            f" (history entries {first}-{last})",
        ])

    # -- bookkeeping -------------------------------------------------------------------------------
    def journal(self, stage: str) -> None:
        """Write the manifest ahead of a step that changes files (crash recovery reads *stage*)."""
        self.manifest["stage"] = stage
        self.manifest["tokens"] = self.meter.to_json()
        self.store.journal(self.run_id, self.manifest)

    def finish(self, state: str, outcome: str, *, reason: str = "", record: bool = True) -> DreamResult:
        """Record the outcome rows (one per guard refusal, one for the update) and close the run."""
        self.manifest["tokens"] = self.meter.to_json()
        self.manifest["stage"] = "done"
        if reason:
            self.manifest["reason"] = reason
        tokens = self.meter.prompt_tokens + self.meter.completion_tokens
        latency = sum(self.meter.latencies_ms) or None
        name = self.workspace.name
        if self.staged is not None:
            self.manifest["guard_rejections"] = list(self.staged.rejections)
            for rejection in self.staged.rejections:
                self.store.record_outcome(KIND, name, "guard_rejected", run_id=self.run_id, reason=rejection["reason"])
        if record:
            self.store.record_outcome(KIND, name, outcome, run_id=self.run_id, reason=reason,
                                      tokens=tokens, latency_ms=latency)
        self.store.finish_run(self.run_id, state=state, outcome=outcome, manifest=self.manifest)
        return DreamResult(self.run_id, state, outcome, self.manifest)


# -- pieces shared with recovery and restore ---------------------------------------------------------
def select_batch(memory_dir: Path, after: int, limit: int, char_budget: int) -> list[HistoryEntry]:
    """Up to *limit* entries after the dream cursor, in cursor order, within a prompt-size budget."""
    pending = sorted((entry for entry in read_history(memory_dir).entries if entry.cursor > after),
                     key=lambda entry: entry.cursor)
    batch, used = [], 0
    for entry in pending[:max(1, limit)]:
        size = min(len(entry.content), prompts.ENTRY_SHOWN_CHARS)
        if batch and used + size > char_budget:
            break
        batch.append(entry)
        used += size
    return batch


def parse_analysis(text: str) -> tuple[list[str], bool]:
    """([TAG] fact lines, whether [SKIP] was said); any other line is ignored and logged."""
    findings, skipped = [], False
    for line in THINK_BLOCK.sub("", text).splitlines():
        line = line.strip()
        if not line:
            continue
        match = FINDING.match(line)
        if match:
            findings.append(f"[{match.group(1)}] {match.group(2).strip()}")
        elif line == SKIP_LINE:
            skipped = True
        else:
            logger.info("dream analysis: ignoring a line that is not a finding: {!r}", line[:120])
    return findings, skipped


def recover_dream_run(run: RunRecord, *, store: StateStore, git: GitStore) -> str:
    """Close a dream run left "started" by a crash: finish it if committed, else roll it back.

    Runs on the calling thread: recovery happens at start-up, before any other git work.
    """
    if not git.opened:
        # Whether the run's commit exists decides between finishing and rolling back.
        git.open()
    manifest = dict(run.manifest)
    stage = manifest.get("stage")
    manifest["recovered"] = True
    if stage == "applying" and git.available:
        try:
            manifest["commit"] = git.find_commit_for_run(run.run_id)
        except GitStoreError as exc:
            logger.warning("could not look for the commit of run {}: {}", run.run_id, exc)
        if manifest.get("commit"):
            stage = "committed"
    if stage in ("committed", "compacting"):
        outcome = "written" if manifest.get("files_changed") else "no_change"
        store.finish_run(run.run_id, state="finished", outcome=outcome, manifest=manifest)
        return "finished"
    if stage == "applying":
        manifest["left_alone"] = roll_back(git.workspace, manifest)
        manifest["cursor_after"] = manifest.get("cursor_before")
        store.record_outcome(KIND, run.workspace, "error", run_id=run.run_id, reason="interrupted; rolled back")
        store.finish_run(run.run_id, state="rolled_back", outcome="rolled_back", manifest=manifest)
        return "rolled_back"
    store.record_outcome(KIND, run.workspace, "error", run_id=run.run_id, reason="interrupted")
    store.finish_run(run.run_id, state="failed", outcome="interrupted", manifest=manifest)
    return "failed"
