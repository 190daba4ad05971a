"""Control API handlers for the upkeep jobs: dream, restore, lifecycle, audit, metrics, search, context."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from nanobotd.index import agent_context as memctx
from nanobotd.state import metrics
from nanobotd.api.router import ApiError, Request, Response, Router
from nanobotd.index.hit import SearchBackendError
from nanobotd.jobs import audit, restore

if TYPE_CHECKING:
    from nanobotd.daemon.daemon import Daemon

SEARCH_MODES = ("search", "vsearch", "query")
MAX_SEARCH_LIMIT = 100


def add_upkeep_routes(router: Router, daemon: "Daemon") -> None:
    """Register the upkeep endpoints."""
    handlers = UpkeepHandlers(daemon)
    for method, pattern, handler in [
        ("POST", "/v1/dream", handlers.dream),
        ("GET", "/v1/dream-log", handlers.dream_log),
        ("POST", "/v1/restore", handlers.restore),
        ("POST", "/v1/lifecycle", handlers.lifecycle),
        ("GET", "/v1/audit", handlers.audit),
        ("GET", "/v1/metrics", handlers.metrics),
        ("GET", "/v1/search", handlers.search),
        ("GET", "/v1/context", handlers.context),
        ("POST", "/v1/reindex", handlers.reindex),
    ]:
        router.add(method, pattern, handler)


class UpkeepHandlers:
    """Handlers; each resolves its workspace (named, or the only one)."""

    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon
        self.upkeep = daemon.services.upkeep

    def _runtimes(self, request: Request, body: dict | None = None):
        name = request.query.get("workspace") or (body or {}).get("workspace")
        if name:
            try:
                return [self.daemon.services.runtime(name)]
            except KeyError as exc:
                raise ApiError(404, "unknown_workspace", str(exc.args[0])) from None
        return list(self.daemon.runtimes.values())

    def _one(self, request: Request, body: dict | None = None):
        runtimes = self._runtimes(request, body)
        if len(runtimes) != 1:
            raise ApiError(400, "workspace_required", "several workspaces are managed; pass workspace=NAME")
        return runtimes[0]

    async def dream(self, request: Request) -> Response:
        body = request.json_object()
        run_ids = []
        for runtime in self._runtimes(request, body):
            if runtime.llm.offline:
                if len(self.daemon.runtimes) == 1 or body.get("workspace"):
                    raise ApiError(409, "offline", "dream needs an LLM; this workspace runs in offline mode")
                continue
            run_ids.append(self.upkeep.submit_dream(runtime))
        if len(run_ids) == 1:
            return Response(202, {"run_id": run_ids[0]})
        return Response(202, {"run_ids": run_ids})

    async def dream_log(self, request: Request) -> dict:
        runtime = self._one(request)
        git = self.upkeep.extra(runtime).git
        target = request.query.get("target") or None
        if target and (run := self.daemon.store.get_run(target)) is not None:
            sha = run.manifest.get("commit") or await git.call(git.find_commit_for_run, target)
            if not sha:
                raise ApiError(404, "no_commit", f"run {target} made no git commit")
            target = sha
        try:
            return {"commit": await git.call(git.show, target)}
        except Exception as exc:
            raise ApiError(404, "no_commit", str(exc)) from None

    async def restore(self, request: Request):
        body = request.json_object()
        target = request.body_value("target", str)
        force = bool(body.get("force", False))
        runtime = self._restore_workspace(target, body, request)
        if body.get("dry_run"):
            try:
                result = await restore.plan_restore(self.upkeep.restore_context(runtime), target, force=force)
            except Exception as exc:
                raise ApiError(409, "cannot_restore", str(exc)) from None
            return {"plan": result.get("plan", []), "kind": result.get("kind")}
        try:
            restore.resolve_target(self.upkeep.restore_context(runtime), target)
        except restore.RestoreError as exc:
            raise ApiError(404 if "no run" in str(exc) else 409, "cannot_restore", str(exc)) from None
        run_id = self.upkeep.submit_restore(runtime, target, force=force)
        return Response(202, {"run_id": run_id})

    def _restore_workspace(self, target: str, body: dict, request: Request):
        run = self.daemon.store.get_run(target)
        if run is not None and not body.get("workspace") and run.workspace in self.daemon.runtimes:
            return self.daemon.runtimes[run.workspace]
        return self._one(request, body)

    async def lifecycle(self, request: Request):
        body = request.json_object()
        runtimes = self._runtimes(request, body)
        if body.get("dry_run"):
            plans = []
            for runtime in runtimes:
                result = await self.upkeep.lifecycle_plan(runtime)
                plans.extend(f"[{runtime.name}] {line}" for line in _plan_lines(result))
            return {"plan": plans}
        run_ids = [self.upkeep.submit_lifecycle(runtime) for runtime in runtimes]
        return Response(202, {"run_id": run_ids[0]} if len(run_ids) == 1 else {"run_ids": run_ids})

    async def audit(self, request: Request) -> dict:
        workspaces = []
        for runtime in self._runtimes(request):
            plan = await self.upkeep.lifecycle_plan(runtime)
            status = self.upkeep.workspace_status(runtime)
            extra_state = dict(runtime.tracker.totals(), git=status.get("git"), search=status.get("search"))
            workspaces.append(audit.audit_workspace(runtime.settings, store=self.daemon.store, now=self.daemon.now(),
                                                    lifecycle_plan=plan.get("plan", []), extra_state=extra_state))
        return {"workspaces": workspaces}

    async def metrics(self, request: Request) -> dict:
        try:
            since = metrics.parse_since(request.query.get("since") or "7d")
        except ValueError as exc:
            raise ApiError(400, "bad_param", str(exc)) from None
        now = self.daemon.clock()
        return metrics.summarize_outcomes(self.daemon.store, since=now - since, now=now)

    async def search(self, request: Request) -> dict:
        query = request.query.get("q", "")
        limit = request.query_int("limit", 10, minimum=1, maximum=MAX_SEARCH_LIMIT)
        mode = request.query.get("mode") or "search"
        if mode not in SEARCH_MODES:
            raise ApiError(400, "bad_param", f"mode must be one of {', '.join(SEARCH_MODES)}")
        runtime = self._one(request)
        hits, backend, degraded = await self.run_search(runtime, query, limit, mode)
        answer = {"backend": backend, "query": query, "hits": [hit.to_json() for hit in hits]}
        if degraded:
            answer["degraded"] = degraded
        return answer

    async def run_search(self, runtime, query: str, limit: int, mode: str):
        """QMD when configured and healthy, else the builtin index (the reason is reported)."""
        extras = self.upkeep.extra(runtime)
        degraded = None
        if extras.qmd is not None:
            try:
                hits = await extras.qmd.search(query, limit=limit, mode=mode)
                if runtime.settings.search.backend == "qmd":
                    return hits, "qmd", None
                builtin = await self._builtin(extras, query, limit)
                return _fuse(hits, builtin, limit), "both", None
            except SearchBackendError as exc:
                degraded = f"qmd unavailable, builtin index used: {exc}"
        return await self._builtin(extras, query, limit), "builtin", degraded

    async def _builtin(self, extras, query: str, limit: int):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.daemon.executor, lambda: extras.index.search(query, limit=limit))

    async def context(self, request: Request) -> dict:
        runtime = self._one(request)
        settings = runtime.settings.context
        budget = request.query_int("budget_tokens", settings.budget_tokens, minimum=1, maximum=2_000_000)
        query = request.query.get("query", "")
        extras = self.upkeep.extra(runtime)

        def search(text: str, limit: int):
            return extras.index.search(text, limit=limit)

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.daemon.executor, lambda: memctx.build_context(
            runtime.settings.path, settings=settings, budget_tokens=budget, query=query, search=search,
            session_key=request.query.get("session") or None))

    async def reindex(self, request: Request) -> dict:
        results = {}
        for runtime in self._runtimes(request, request.json_object()):
            results[runtime.name] = await self.upkeep.reindex(runtime)
        return {"reindexed": results}


def _plan_lines(result: dict) -> list[str]:
    lines = []
    for step in result.get("plan", []):
        lines.append(step if isinstance(step, str) else step.get("describe") or _describe(step))
    for skipped in result.get("skipped", []):
        lines.append(f"skip {skipped.get('path')}: {skipped.get('reason')}")
    return lines or ["nothing to do"]


def _describe(step: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in step.items() if key not in ("backup",))


def _fuse(first: list, second: list, limit: int) -> list:
    """Reciprocal-rank fusion of two hit lists, de-duplicated by location."""
    scores: dict[tuple, float] = {}
    keep: dict[tuple, object] = {}
    for hits in (first, second):
        for rank, hit in enumerate(hits):
            key = (hit.path, hit.line_start, hit.session_key, hit.message_start)
            scores[key] = scores.get(key, 0.0) + 1.0 / (60 + rank)
            keep.setdefault(key, hit)
    ordered = sorted(scores, key=scores.get, reverse=True)
    return [keep[key] for key in ordered[:limit]]
