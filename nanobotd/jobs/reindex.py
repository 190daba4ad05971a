"""reindex: rebuild a workspace's search indexes from scratch (builtin, and QMD when enabled).

A run like the others, so it is followed like them; it changes no memory: nothing to recover or restore.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.errors import RestoreError
from nanobotd.jobs.job import JobDefaults
from nanobotd.state.store import RunRecord

KIND = "reindex"


class Reindex(JobDefaults):
    """params: none."""

    kind = KIND
    restorable = False
    writes_memory = refresh_waits = False

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        stats = await asyncio.to_thread(env.index.rebuild)
        qmd = env.qmd if env.qmd is not None and env.qmd.available else None
        if qmd is not None:
            await qmd.update_now()
        manifest = {"stats": stats, "qmd": "updated" if qmd else None, "backend": env.settings.search.backend}
        env.store.finish_run(run_id, state="finished", outcome="reindexed", manifest=manifest)
        return manifest

    def recover(self, env: JobEnv, run: RunRecord) -> str:
        """Nothing of memory to finish or roll back: the next refresh or reindex rebuilds what was left."""
        env.store.finish_run(run.run_id, state="failed", outcome="interrupted")
        return "interrupted"

    async def restore(self, env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        raise RestoreError(f"runs of kind {KIND!r} change nothing that could be restored")

    def changes(self, manifest: dict) -> dict:
        stats = manifest.get("stats") if isinstance(manifest.get("stats"), dict) else {}
        return {"units_indexed": int(stats.get("units_added") or 0),
                "files_indexed": int(stats.get("files_reindexed") or 0)}
