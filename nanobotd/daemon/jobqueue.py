"""The job queue: every job is a run; one job per session at a time; bounded LLM concurrency.

`llm.concurrency` bounds LLM requests in flight daemon-wide: each request holds one of `llm_slots` (shared by every
workspace's client) only while it runs. A job's local work between requests holds no slot, so up to JOBS_PER_LLM_SLOT x
concurrency LLM jobs run at once: while one works locally, another's request waits, prepared by the LLM worker, and goes
the moment a slot frees (`llm.worker`), keeping the slots busy through a burst of sessions.

Submitting a job already queued for the same target returns the queued run, so a burst of triggers costs one run; a
queued job of smaller scope (a budget consolidation) is not joined by one that must do more (a manual one), which queues
behind it. Runs are created "queued" in the ledger first, so `nanobotctl run RUN_ID` can follow a job from the 202
answer on; every run that ends gets one INFO log line."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loguru import logger

from nanobotd.daemon import runview
from nanobotd.llm.client import LLMSlots
from nanobotd.state.store import RunRecord, StateStore
from nanobotd.tuning import FAILURE_RETRY_SECONDS, JOBS_PER_LLM_SLOT, MAX_FAILURE_RETRY_SECONDS

JobBody = Callable[[str], Awaitable[object]]


@dataclass
class _Job:
    run_id: str
    kind: str
    target: tuple[str, str]
    body: JobBody
    uses_llm: bool
    scope: int = 0
    recover: Callable[[RunRecord], str | None] | None = None  # closes a run an exception left open, as a crash
    phase: str = "queued"
    task: asyncio.Task | None = None


class JobQueue:
    """Runs jobs on the daemon's loop with per-target exclusion, LLM jobs bounded, LLM requests bounded."""

    def __init__(self, store: StateStore, *, llm_concurrency: int = 2):
        self.store = store
        self.llm_slots = LLMSlots(max(1, llm_concurrency))  # one per LLM request in flight
        self._llm_jobs = asyncio.Semaphore(self.llm_slots.count * JOBS_PER_LLM_SLOT)
        self._target_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._queued: dict[tuple[str, str, str], _Job] = {}  # the job a submit for this key joins
        self._running: dict[str, _Job] = {}
        self._jobs: dict[str, _Job] = {}  # every job not yet ended, by run id
        self.accepting = True  # False once the daemon is stopping

    def submit(self, kind: str, workspace: str, target: str, body: JobBody, *, session_key: str | None = None,
               uses_llm: bool = True, manifest: dict | None = None, join_running: bool = False,
               scope: int = 0, recover: Callable[[RunRecord], str | None] | None = None) -> str:
        """Queue a job; returns its run_id. A queued job of this kind and target is reused if its *scope* is at least
        this one's, with *join_running* a running one too (no nightly job runs twice at once or queues after itself)."""
        if not self.accepting:
            raise RuntimeError("the daemon is stopping and takes no new jobs")
        coalesce_key = (kind, workspace, target)
        joined = self.joinable(kind, workspace, target, scope=scope, join_running=join_running)
        if joined is not None:
            return joined
        run_id = self.store.create_run(kind, workspace, session_key=session_key, manifest=manifest or {},
                                       state="queued")
        job = _Job(run_id, kind, (workspace, target), body, uses_llm, scope, recover=recover)
        self._queued[coalesce_key] = job
        self._jobs[run_id] = job
        job.task = asyncio.get_running_loop().create_task(self._run(job, coalesce_key), name=f"job-{run_id}")
        return run_id

    def joinable(self, kind: str, workspace: str, target: str, *, scope: int = 0,
                 join_running: bool = False) -> str | None:
        """The run a submit with these arguments would join instead of queueing a new one, if any."""
        coalesce_key = (kind, workspace, target)
        queued = self._queued.get(coalesce_key)
        if queued is not None and queued.scope >= scope:
            return queued.run_id
        if join_running:
            for job in self._running.values():
                if (job.kind, *job.target) == coalesce_key:
                    return job.run_id
        return None

    def phase(self, run_id: str) -> str | None:
        """queued, waiting_for_llm or running for a job this queue holds; None otherwise."""
        job = self._jobs.get(run_id)
        return job.phase if job is not None else None

    async def wait_ended(self, run_id: str, timeout: float) -> None:
        """Return once run *run_id* has ended here, or after *timeout* seconds (at once for a run this queue
        does not hold: ended already, or never its own)."""
        job = self._jobs.get(run_id)
        if job is not None and job.task is not None and timeout > 0:
            await asyncio.wait({job.task}, timeout=timeout)

    def busy(self, workspace: str, target: str) -> bool:
        """A job for this target is queued or running."""
        return any(job.target == (workspace, target) for job in self._jobs.values())

    def running_in(self, workspace: str, kind: str) -> bool:
        """A job of *kind* is running for *workspace*."""
        return any(job.kind == kind and job.target[0] == workspace for job in self._running.values())

    def running_kinds(self) -> list[str]:
        """Kinds of the jobs running now (for status)."""
        return [job.kind for job in self._running.values()]

    async def _run(self, job: _Job, coalesce_key: tuple[str, str, str]) -> None:
        lock = self._target_locks.setdefault(job.target, asyncio.Lock())
        try:
            async with lock:
                self._leave_queue(job, coalesce_key)
                if job.uses_llm:
                    job.phase = "waiting_for_llm"
                async with self._llm_jobs if job.uses_llm else contextlib.nullcontext():
                    await self._execute(job)
        except asyncio.CancelledError:
            self._leave_queue(job, coalesce_key)
            run = self.store.get_run(job.run_id)
            if run is not None and run.state == "queued":
                self.store.finish_run(job.run_id, state="cancelled", outcome="cancelled")
                logger.info("run {} ({}, workspace {}) cancelled before it started", job.run_id, job.kind,
                            job.target[0])
            raise
        finally:
            self._jobs.pop(job.run_id, None)

    def _leave_queue(self, job: _Job, coalesce_key: tuple[str, str, str]) -> None:
        # A job of wider scope may have taken the slot meanwhile: only free the slot this job holds.
        if self._queued.get(coalesce_key) is job:
            del self._queued[coalesce_key]

    async def _execute(self, job: _Job) -> None:
        self._running[job.run_id] = job
        job.phase = "running"
        try:
            self.store.start_run(job.run_id)
            await job.body(job.run_id)
        except Exception as exc:  # a job's bug must not take the daemon down (a cancellation is no Exception)
            logger.opt(exception=exc).error("{} job {} failed: {}", job.kind, job.run_id, exc)
            self._record_failure(job, f"{type(exc).__name__}: {exc}")
        finally:
            self._running.pop(job.run_id, None)
            self._log_end(job.run_id)

    def _record_failure(self, job: _Job, error: str, delay: float = FAILURE_RETRY_SECONDS) -> None:
        """Close a run an exception left open: recovered as after a crash when its kind journals (what it appended is
        marked or rolled back), else failed. When that cannot be written either (a full disk), it is tried again, less
        and less often: left open, the run would show as running, and a client waiting for it would wait, as long
        as the daemon runs; closed as failed without its recovery, its appended messages would be archived again."""
        try:
            run = self.store.get_run(job.run_id)
            if run is None or run.state not in ("queued", "started"):
                return
            run = dataclasses.replace(run, manifest=dict(run.manifest, error=error))
            if job.recover is not None:
                outcome = job.recover(run)
                logger.warning("run {} failed; recovery: {}", job.run_id,
                               outcome or "none yet: its workspace was removed, it is recovered when it is back")
            else:
                self.store.finish_run(job.run_id, state="failed", outcome="error", manifest=run.manifest)
        except Exception as exc:
            logger.error("run {} failed and its end cannot be written ({}); trying again in {:g} s", job.run_id, exc,
                         delay)
            asyncio.get_running_loop().call_later(delay, self._record_failure, job, error,
                                                  min(delay * 2, MAX_FAILURE_RETRY_SECONDS))

    def _log_end(self, run_id: str) -> None:
        try:
            run = self.store.get_run(run_id)
        except Exception as exc:  # the store may be closing under a cancelled job; the line is not worth a crash
            logger.debug("no end line for run {}: {}", run_id, exc)
            return
        if run is not None:
            logger.info("{}", runview.end_line(run))

    async def drain(self, timeout: float, workspace: str | None = None) -> None:
        """Cancel queued jobs and give running ones *timeout* seconds to reach their end: every job, and no new
        one taken (the daemon stops), or those of *workspace* only (a reload closes it)."""
        if workspace is None:
            self.accepting = False
        jobs = [job for job in self._jobs.values() if workspace in (None, job.target[0]) and job.task is not None]
        waiting = [job.task for job in jobs if job.phase != "running"]
        for task in waiting:
            task.cancel()
        tasks = [job.task for job in jobs if job.phase == "running"]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)
        if waiting:
            await asyncio.wait(waiting, timeout=2)

    async def wait_idle(self) -> None:
        """Wait until nothing is queued or running (tests and one-shot mode)."""
        while self._jobs:
            tasks = [job.task for job in self._jobs.values() if job.task]
            if tasks:
                await asyncio.wait(tasks)
            else:
                await asyncio.sleep(0.01)
