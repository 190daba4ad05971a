"""The job registry: every kind of run and the Job that runs, recovers, restores and queues it. Dispatch by kind is
written here once; the daemon reads it, and restore receives it through `JobEnv.kinds`."""

from __future__ import annotations

from nanobotd.jobs.consolidate import Consolidate
from nanobotd.jobs.dream import Dream
from nanobotd.jobs.flush import Flush
from nanobotd.jobs.job import Job
from nanobotd.jobs.lifecycle import Lifecycle
from nanobotd.jobs.reindex import Reindex
from nanobotd.jobs.restore import Restore

JOB_KINDS: dict[str, Job] = {job.kind: job for job in (Consolidate(), Flush(), Dream(), Lifecycle(), Restore(),
                                                       Reindex())}
SCHEDULED_KINDS = tuple(kind for kind, job in JOB_KINDS.items() if job.scheduled)  # cron, caught up after downtime


def job_kind(kind: str) -> Job:
    """The Job of *kind*; KeyError naming the known kinds otherwise."""
    try:
        return JOB_KINDS[kind]
    except KeyError:
        raise KeyError(f"unknown job kind {kind!r} (known: {', '.join(JOB_KINDS)})") from None
