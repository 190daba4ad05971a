"""Search, context and recall: what an agent asks of nanobotd's memory, and keeping the indexes rebuilt."""

from __future__ import annotations

import asyncio
import re
from datetime import date

from nanobotd.api.router import ApiError, Request
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import one_workspace, session_workspace
from nanobotd.daemon.workspace import Workspace
from nanobotd.index import agent_context
from nanobotd.index.hit import SearchBackendError
from nanobotd.memory import recall

SEARCH_MODES = ("search", "vsearch", "query")
MAX_SEARCH_LIMIT = 100
MAX_RECALL_DAYS = 31
MAX_RECALL_CHARS = 1_000_000
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def routes(core: Core) -> list:
    """The search, context and recall endpoints."""
    handlers = SearchHandlers(core)
    return [
        ("GET", "/v1/search", handlers.search),
        ("GET", "/v1/context", handlers.context),
        ("GET", "/v1/recall", handlers.recall),
    ]


class SearchHandlers:
    """Search runs on the executor; QMD is asked first when configured, the builtin index is the fallback."""

    def __init__(self, core: Core):
        self.core = core

    async def search(self, request: Request) -> dict:
        query = request.query.get("q", "")
        limit = request.query_int("limit", 10, minimum=1, maximum=MAX_SEARCH_LIMIT)
        mode = request.query.get("mode") or "search"
        if mode not in SEARCH_MODES:
            raise ApiError(400, "bad_param", f"mode must be one of {', '.join(SEARCH_MODES)}")
        workspace = one_workspace(self.core, request)
        hits, backend, degraded = await self.run_search(workspace, query, limit, mode)
        answer = {"backend": backend, "query": query, "mode": mode, "hits": [hit.to_json() for hit in hits]}
        if degraded:
            answer["degraded"] = degraded
        fallback = mode_fallback(workspace, mode, backend, hits)
        if fallback:
            answer["fallback"] = fallback
        return answer

    async def run_search(self, workspace: Workspace, query: str, limit: int, mode: str):
        """QMD when configured and healthy, else the builtin index (the reason is reported)."""
        degraded = None
        if workspace.qmd is not None:
            try:
                hits = await workspace.qmd.search(query, limit=limit, mode=mode)
                if workspace.settings.search.backend == "qmd":
                    return hits, "qmd", None
                builtin = await self._builtin(workspace, query, limit)
                return fuse(hits, builtin, limit), "both", None
            except SearchBackendError as exc:
                degraded = f"qmd unavailable, builtin index used: {exc}"
        return await self._builtin(workspace, query, limit), "builtin", degraded

    async def _builtin(self, workspace: Workspace, query: str, limit: int):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.core.executor, lambda: workspace.index.search(query, limit=limit))

    async def context(self, request: Request) -> dict:
        """The budgeted context; an unknown session is a 404, and a context that came out empty says why."""
        session_key = request.query.get("session") or None
        if session_key:
            workspace = session_workspace(self.core, session_key, request.query.get("workspace"))
        else:
            workspace = one_workspace(self.core, request)
        settings = workspace.settings.context
        budget = request.query_int("budget_tokens", settings.budget_tokens, minimum=1, maximum=2_000_000)
        query = request.query.get("query", "")

        def search(text: str, limit: int):
            return workspace.index.search(text, limit=limit)

        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self.core.executor, lambda: agent_context.build_context(
            workspace.settings.path, settings=settings, budget_tokens=budget, query=query, search=search,
            session_key=session_key))
        if not str(answer.get("text") or "").strip():
            answer["warning"] = empty_context_warning(answer, budget)
        return answer

    async def recall(self, request: Request) -> dict:
        """The daily notes and history entries of the days from..to (to defaults to from), capped."""
        first = query_date(request, "from")
        last = query_date(request, "to", default=first)
        if last < first:
            raise ApiError(400, "bad_param", "'to' must not be before 'from'")
        if (last - first).days >= MAX_RECALL_DAYS:
            raise ApiError(400, "bad_param", f"ask for at most {MAX_RECALL_DAYS} days at a time")
        max_chars = request.query_int("max_chars", recall.DEFAULT_MAX_CHARS, minimum=1000, maximum=MAX_RECALL_CHARS)
        workspace = one_workspace(self.core, request)
        memory_dir = workspace.env.memory_dir
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self.core.executor,
                                            lambda: recall.collect(memory_dir, first, last, max_chars))
        return {"workspace": workspace.name, **answer}


def mode_fallback(workspace: Workspace, mode: str, backend: str, hits: list) -> str | None:
    """Why a vector mode (vsearch, query) searched by keywords instead, or None when it did not."""
    if mode == "search":
        return None
    if backend == "builtin":
        return (f"--mode {mode} needs QMD with vectors (search.backend = \"qmd\" or \"both\", "
                f"search.qmd_vectors = true); the builtin index searched by keywords instead")
    reasons = sorted({str(hit.extra.get("degraded")) for hit in hits if (hit.extra or {}).get("degraded")})
    return f"QMD could not {mode} ({'; '.join(reasons)}); it searched by keywords instead" if reasons else None


def empty_context_warning(answer: dict, budget: int) -> str:
    """Why the context is empty: the budget fit nothing that exists, or there is no memory yet."""
    omitted = answer.get("omitted") or []
    too_big = [item.get("name") for item in omitted if "budget" in str(item.get("reason", ""))]
    if too_big:
        return (f"the context is empty: a budget of {budget} tokens fits none of {', '.join(map(str, too_big))}; "
                f"raise the budget")
    return "the context is empty: this workspace has no bootstrap files, MEMORY.md or history yet"


def query_date(request: Request, name: str, default: date | None = None) -> date:
    """A YYYY-MM-DD query parameter; 400 naming it when missing or not a real date."""
    raw = request.query.get(name, "").strip()
    if not raw:
        if default is None:
            raise ApiError(400, "bad_param", f"query parameter '{name}' is required (YYYY-MM-DD)")
        return default
    try:
        if not DATE.fullmatch(raw):
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError:
        message = f"query parameter '{name}' must be a date as YYYY-MM-DD, not {raw!r}"
        raise ApiError(400, "bad_param", message) from None


def fuse(first: list, second: list, limit: int) -> list:
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
