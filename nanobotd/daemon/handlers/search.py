"""Search, context and recall: what an agent asks of nanobotd's memory, and keeping the indexes rebuilt."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from datetime import date

from nanobotd.api.app import ApiError, Request
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import blocking, one_workspace, session_workspace
from nanobotd.daemon.workspace import Workspace
from nanobotd.index import agent_context, vectors
from nanobotd.index.hit import SearchBackendError
from nanobotd.memory import recall as recall_notes

SEARCH_MODES = ("search", "vsearch", "query")
MAX_SEARCH_LIMIT = 100
MAX_RECALL_DAYS = 31
MAX_RECALL_CHARS = 1_000_000
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


async def search(core: Core, request: Request) -> dict:
    """Hits for `q` from the configured backend, saying which answered and why a mode fell back."""
    query = request.query.get("q", "")
    limit = request.query_int("limit", 10, minimum=1, maximum=MAX_SEARCH_LIMIT)
    mode = request.query.get("mode") or "search"
    if mode not in SEARCH_MODES:
        raise ApiError(400, "bad_param", f"mode must be one of {', '.join(SEARCH_MODES)}")
    workspace = one_workspace(core, request)
    min_score = request.query_value("min_score", workspace.settings.search.min_score, unit_number, "a number in 0..1")
    found = await run_search(core, workspace, query, limit, mode, min_score)
    answer = {"query": query, "mode": mode, **found.summary(), "hits": [hit.to_json() for hit in found.hits]}
    reasons = (answer.get("fallback"), mode_fallback(workspace, mode, found.backend, found.hits))
    fallbacks = [text for text in reasons if text]
    if fallbacks:
        answer["fallback"] = "; ".join(fallbacks)
    return answer


async def run_search(core: Core, workspace: Workspace, query: str, limit: int, mode: str = "search",
                     min_score: float | None = None) -> Found:
    """The configured backend's hits (QMD, builtin or both fused); when QMD fails or is slow the builtin answers, named.
    All hits share one scale, so *min_score* (default search.min_score) means the same whichever backend answered."""
    min_score = workspace.settings.search.min_score if min_score is None else min_score
    degraded = None
    if workspace.qmd is not None:
        try:
            found = await workspace.qmd.search(query, limit=limit, mode=mode)
            hits = [hit for hit in await blocking(core, workspace.index.rescore, query, found)
                    if hit.score >= min_score]
            if workspace.settings.search.backend == "qmd":
                return Found(hits, "qmd")
            builtin = await _builtin(core, workspace, query, limit, min_score)
            return Found(fuse(hits, builtin, limit), "both")
        except SearchBackendError as exc:
            degraded = f"{exc}; answered by the builtin index"
    hits = await _builtin(core, workspace, query, limit, min_score)
    return Found(hits, "builtin", degraded, "the builtin index answered instead of QMD" if degraded else None)


async def _builtin(core: Core, workspace: Workspace, query: str, limit: int, min_score: float):
    return await blocking(core, lambda: workspace.index.search(query, limit=limit, min_score=min_score))


async def context(core: Core, request: Request) -> dict:
    """The budgeted context; its search hits come from the same search as /v1/search (backend per config).
    An unknown session is a 404, and a context that came out empty says why."""
    session_key = request.query.get("session") or None
    if session_key:
        workspace = session_workspace(core, session_key, request.query.get("workspace"))
    else:
        workspace = one_workspace(core, request)
    settings = workspace.settings.context
    budget = request.query_int("budget_tokens", settings.budget_tokens, minimum=1, maximum=2_000_000)
    query = request.query.get("query", "")
    found = Found([], "none")
    if query.strip():
        found = await run_search(core, workspace, query, agent_context.SEARCH_FETCH)
    answer = await blocking(core, lambda: agent_context.build_context(
        workspace.settings.path, budget_tokens=budget, query=query,
        search=lambda text, limit: found.hits[:limit], session_key=session_key))
    if not str(answer.get("text") or "").strip():
        answer["warning"] = empty_context_warning(answer, budget)
    return {**answer, "search": found.summary()}


async def recall(core: Core, request: Request) -> dict:
    """The daily notes and history entries of the days from..to (to defaults to from), capped."""
    first = query_date(request, "from")
    last = query_date(request, "to", default=first)
    if last < first:
        raise ApiError(400, "bad_param", "'to' must not be before 'from'")
    if (last - first).days >= MAX_RECALL_DAYS:
        raise ApiError(400, "bad_param", f"ask for at most {MAX_RECALL_DAYS} days at a time")
    max_chars = request.query_int("max_chars", recall_notes.DEFAULT_MAX_CHARS, minimum=1000, maximum=MAX_RECALL_CHARS)
    workspace = one_workspace(core, request)
    memory_dir = workspace.env.memory_dir
    answer = await blocking(core, lambda: recall_notes.collect(memory_dir, first, last, max_chars))
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
    return ("the context is empty: nothing matches the query and no history is newer than the last dream "
            "(SOUL.md, USER.md and MEMORY.md are left out: nanobot puts them in its prompt itself)")


def query_date(request: Request, name: str, default: date | None = None) -> date:
    """A YYYY-MM-DD query parameter; 400 naming it when missing or not a real date."""
    raw = request.query.get(name, "").strip()
    if not raw and default is None:
        raise ApiError(400, "bad_param", f"query parameter '{name}' is required (YYYY-MM-DD)")
    return request.query_value(name, default, day, f"a date as YYYY-MM-DD, not {raw!r}")


def day(text: str) -> date:
    """A date written YYYY-MM-DD (fromisoformat alone takes 20261120 too); ValueError otherwise."""
    if not DATE.fullmatch(text):
        raise ValueError(text)
    return date.fromisoformat(text)


@dataclass(frozen=True)
class Found:
    """What one search gave: hits, which backend answered, and why not the configured one (if so)."""

    hits: list
    backend: str
    degraded: str | None = None
    fallback: str | None = None

    def summary(self) -> dict:
        """backend, and degraded/fallback when the configured backend could not answer."""
        answer = {"backend": self.backend}
        if self.degraded:
            answer.update(degraded=self.degraded, fallback=self.fallback)
        return answer


def unit_number(text: str) -> float:
    """A number in 0..1 (a score); ValueError otherwise."""
    if not 0.0 <= (value := float(text)) <= 1.0:
        raise ValueError(text)
    return value


def fuse(first: list, second: list, limit: int) -> list:
    """Reciprocal-rank fusion of two hit lists, de-duplicated by location."""
    location = operator.attrgetter("path", "line_start", "session_key", "message_start")
    keys = [[location(hit) for hit in part] for part in (first, second)]
    keep = dict(reversed(list(zip(keys[0] + keys[1], first + second, strict=True))))  # each location's first hit
    return [keep[key] for key in vectors.fuse(*keys, offset=vectors.RRF_K)[:limit]]


ROUTES = [  # Search runs on the executor; QMD is asked first when configured, the builtin index is the fallback.
    ("GET", "/v1/search", search),
    ("GET", "/v1/context", context),
    ("GET", "/v1/recall", recall),
]
