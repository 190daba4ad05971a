"""The dream job: find what changed in new history and daily notes (phase 1), edit the memory files (phase 2), batch
after batch until the backlog is drained or the token budget spent; a file over its cap first gets condensed.

Phase 2 edits staged copies; only batches whose tool loop completed reach the disk, in one journalled apply step on the
git thread (`apply.py`). A run cut short is rolled back at the next start, so the same batches are dreamt again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from loguru import logger

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.gitstore.store import GitStore
from nanobotd.jobs.dream import prompts
from nanobotd.jobs.dream.apply import KIND, ApplyStep, DreamError, describe_left
from nanobotd.jobs.dream.inputs import Backlog, Batch, read_backlog
from nanobotd.jobs.dream.tools import TOOL_SCHEMAS, StagedFiles
from nanobotd.jobs.dreamnotes import cap_overruns
from nanobotd.llm.client import LLMClient
from nanobotd.llm.failures import LLMError
from nanobotd.llm.reply import LLMReply, UsageMeter
from nanobotd.memory.history import read_dream_cursor
from nanobotd.state.store import StateStore
from nanobotd.tuning import CHARS_PER_TOKEN, INPUT_SHARE

ITERATION_BOUND = "iteration bound"
TOKEN_BUDGET = "token budget"
NEXT_BATCH_WOULD_NOT_FIT = "token budget: the next batch would not fit"
WITHIN_CAPS, STILL_OVER, DISCARDED = "within caps", "still over", "discarded"  # how a condensing pass ended
KEPT = (WITHIN_CAPS, STILL_OVER)


@dataclass(frozen=True)
class DreamResult:
    """How a dream run ended, with its manifest."""

    run_id: str
    state: str
    outcome: str
    manifest: dict


class DreamRun(ApplyStep):
    """One dream of the history and note backlog into SOUL.md / USER.md / MEMORY.md: `run` on the event loop, `apply` on
    the git thread. LLM, git or file trouble never raises: the run ends failed ("error"), the cursor unchanged."""

    def __init__(self, workspace: WorkspaceSettings, *, store: StateStore, llm: LLMClient, git: GitStore,
                 run_id: str, clock: Callable[[], datetime] = datetime.now,
                 on_stage: Callable[[str], None] | None = None):
        self.workspace, self.store, self.llm, self.git = workspace, store, llm, git
        self.run_id, self.max_history_entries = run_id, workspace.lifecycle.max_history_entries
        self.on_stage = on_stage or (lambda stage: None)
        self.memory_dir = workspace.path / "memory"
        self.meter = UsageMeter()
        self.staged: StagedFiles | None = None
        self.batch_tokens: list[int] = []
        self.manifest: dict = {
            "started_at": clock().isoformat(timespec="seconds"), "stage": "reading", "analysis": [],
            "entries": [], "notes_read": {}, "batches": [], "cursor_before": None, "cursor_after": None,
            "files_changed": {}, "commit": None, "history_compacted": {"removed": 0, "backup": None},
            "guard_rejections": [], "iterations": 0,
        }

    async def run(self) -> DreamResult:
        """The batches, then the apply step; every failure becomes a finished run."""
        if self.llm.offline:
            return self.finish("finished", "skipped_offline", record=False)
        cursor = read_dream_cursor(self.memory_dir)
        self.manifest.update(cursor_before=cursor, cursor_after=cursor)
        backlog = await asyncio.to_thread(read_backlog, self.memory_dir, cursor)
        self.staged = await asyncio.to_thread(StagedFiles, self.workspace.path, self.workspace.context)
        overruns = cap_overruns(self.staged.sizes(), self.workspace.context)
        if not backlog and not overruns:
            return self.finish("finished", "no_change")
        try:
            if overruns:
                await self.condense(overruns)
            await self.drain(backlog)
        except (LLMError, DreamError) as exc:
            logger.warning("dream {} of {} failed: {}", self.run_id, self.workspace.name, exc)
            return self.finish("failed", "error", reason=str(exc))
        except asyncio.CancelledError:
            self.finish("failed", "error", reason="cancelled")
            raise
        condensing = self.manifest.get("condensed", {})
        if not self.kept_work() and condensing.get("outcome") == DISCARDED:
            return self.finish("failed", "error", reason=f"condensing pass: {condensing['reason']}")
        return await self.git.call(self.apply, self.manifest["entries"][-1] if self.manifest["entries"] else cursor)

    def kept_work(self) -> bool:
        """Whether a completed batch or condensing pass has edits or cursor moves to apply."""
        return bool(self.manifest["batches"]) or self.manifest.get("condensed", {}).get("outcome") in KEPT

    # -- the condensing pass ------------------------------------------------------------------------
    async def condense(self, overruns: list[str]) -> None:
        """Ask the model to shorten the files over their caps without losing facts (only shortening edits
        pass the guard); kept only when its loop completes, and later edits are measured from its result."""
        record = {"over": overruns, "before": self.staged.sizes()}
        self.manifest["condensed"] = record
        self.manifest["stage"] = "condensing"
        mark = self.staged.checkpoint()
        self.staged.condensing = True
        try:
            await self.tool_loop(prompts.CONDENSE_SYSTEM, prompts.condense_request(overruns, self.file_sections()))
        except (LLMError, DreamError) as exc:
            self.staged.rewind(mark)
            record.update(outcome=DISCARDED, reason=str(exc))
            logger.warning("condensing pass of dream {} discarded: {}", self.run_id, exc)
            return
        finally:
            self.staged.condensing = False
        self.staged.settle()
        record["after"] = self.staged.sizes()
        record["outcome"] = STILL_OVER if cap_overruns(record["after"], self.workspace.context) else WITHIN_CAPS

    # -- batches -----------------------------------------------------------------------------------
    async def drain(self, backlog: Backlog) -> None:
        """Dream batch after batch; a failed batch is discarded and ends the run (failed if it was the first)."""
        settings = self.workspace.dream
        char_budget = int(self.workspace.llm.context_window * CHARS_PER_TOKEN * INPUT_SHARE)
        while backlog:
            stop = self.budget_stop()
            if stop:
                self.stop(stop, backlog)
                return
            batch = backlog.next_batch(settings.batch_entries, char_budget)
            mark, spent = self.staged.checkpoint(), self.tokens
            try:
                findings, skipped = await self.dream_batch(batch)
            except (LLMError, DreamError) as exc:
                self.staged.rewind(mark)
                if not self.kept_work():
                    raise
                self.stop(str(exc), backlog)
                return
            backlog.consume(batch)
            self.batch_tokens.append(self.tokens - spent)
            self.batch_done(batch, findings, skipped)
        self.manifest["left"] = backlog.left()

    async def dream_batch(self, batch: Batch) -> tuple[list[str], bool]:
        """Phase 1 and, when it found something, phase 2 for one batch; returns its findings and [SKIP]."""
        findings, skipped = await self.analyse(batch)
        if findings:
            if self.tokens >= self.workspace.dream.token_budget:
                raise DreamError(TOKEN_BUDGET)
            self.manifest["stage"] = "editing"
            await self.tool_loop(prompts.EDIT_SYSTEM, prompts.edit_request(findings, self.file_sections()))
        return findings, skipped

    def budget_stop(self) -> str | None:
        """Why no further batch should start: the budget is spent, or the costliest batch so far would not fit."""
        budget = self.workspace.dream.token_budget
        if self.tokens >= budget:
            return TOKEN_BUDGET
        if self.batch_tokens and self.tokens + max(self.batch_tokens) > budget:
            return NEXT_BATCH_WOULD_NOT_FIT
        return None

    def batch_done(self, batch: Batch, findings: list[str], skipped: bool) -> None:
        """A completed batch: its entries move the cursor target, its bullets count as read once applied."""
        self.manifest["batches"].append({**batch.describe(), "findings": len(findings), "skipped": skipped,
                                         "tokens": self.batch_tokens[-1]})
        if batch.entries:
            first = self.manifest["entries"][0] if self.manifest["entries"] else batch.entries[0].cursor
            self.manifest["entries"] = [first, batch.entries[-1].cursor]
        for day, digests in batch.note_digests().items():
            self.manifest["notes_read"].setdefault(day, []).extend(digests)
        analysis = [line for line in self.manifest["analysis"] if line != prompts.SKIP_LINE] + findings
        self.manifest["analysis"] = analysis or ([prompts.SKIP_LINE] if skipped or self.manifest["analysis"] else [])

    def stop(self, reason: str, backlog: Backlog) -> None:
        """End the run early, keeping the completed batches, and say what is left."""
        self.manifest["stopped"], self.manifest["left"] = reason, backlog.left()
        logger.info("dream {} of {} stopped early ({}); left: {}", self.run_id, self.workspace.name, reason,
                    describe_left(self.manifest["left"]))

    @property
    def tokens(self) -> int:
        """Tokens the run has spent so far."""
        return self.meter.prompt_tokens + self.meter.completion_tokens

    # -- phase 1 -----------------------------------------------------------------------------------
    async def analyse(self, batch: Batch) -> tuple[list[str], bool]:
        """Ask which facts are new or conflicting; [SKIP] or no valid finding means nothing to edit."""
        self.manifest["stage"] = "analysing"
        messages = [
            {"role": "system", "content": prompts.ANALYSIS_SYSTEM},
            {"role": "user", "content": prompts.analysis_request(self.file_sections(), batch.entries, batch.notes)},
        ]
        reply = await self.complete(messages)
        if reply.finish_reason == "length":
            raise DreamError("analysis cut off (finish_reason length)")
        if not reply.content.strip():
            raise DreamError("empty analysis")
        return prompts.parse_analysis(reply.content)

    # -- phase 2 -----------------------------------------------------------------------------------
    async def tool_loop(self, system: str, request: str) -> None:
        """The bounded tool loop; ends normally only when the model answers without tool calls."""
        settings = self.workspace.dream
        messages = [{"role": "system", "content": system}, {"role": "user", "content": request}]
        for _ in range(settings.max_iterations):
            self.manifest["iterations"] += 1
            reply = await self.complete(messages, tools=TOOL_SCHEMAS)
            if not reply.tool_calls:
                return
            messages.append(reply.assistant_message())
            for call in reply.tool_calls:
                result = self.staged.run(call.name, call.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if self.tokens >= settings.token_budget:
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
        """The three memory files as the prompts show them (with the run's edits so far)."""
        staged = self.staged
        return [prompts.format_file(path, staged.current.get(path), staged.unavailable.get(path))
                for path in MEMORY_FILES]

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
        if not reason and state == "finished" and self.manifest.get("stopped"):
            reason = f"stopped early ({self.manifest['stopped']}); left: {describe_left(self.manifest['left'])}"
        if reason:
            self.manifest["reason"] = reason
        name = self.workspace.name
        if self.staged is not None:
            self.manifest["guard_rejections"] = list(self.staged.rejections)
            for rejection in self.staged.rejections:
                self.store.record_outcome(KIND, name, "guard_rejected", run_id=self.run_id, reason=rejection["reason"])
        if record:
            self.store.record_outcome(KIND, name, outcome, run_id=self.run_id, reason=reason, tokens=self.tokens,
                                      latency_ms=sum(self.meter.latencies_ms) or None)
        self.store.finish_run(self.run_id, state=state, outcome=outcome, manifest=self.manifest)
        return DreamResult(self.run_id, state, outcome, self.manifest)
