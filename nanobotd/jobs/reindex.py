"""reindex: rebuild a workspace's search indexes from scratch (builtin, and QMD when enabled), as a run to follow like
any; it changes no memory, so an interrupted one is only reported (the next refresh rebuilds what was left)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.job import Job

KIND = "reindex"


class Reindex(Job):
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

    def changes(self, manifest: dict) -> dict:
        stats = manifest.get("stats") if isinstance(manifest.get("stats"), dict) else {}
        return {"units_indexed": int(stats.get("units_added") or 0),
                "files_indexed": int(stats.get("files_reindexed") or 0)}
