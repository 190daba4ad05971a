"""Commands that read memory the way an agent does: search, and the budgeted context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.cli.invocation import Invocation
from nanobotd.cli.render import format_cell, format_location


def search(invocation: Invocation) -> int:
    """Search memory; numbered hits with where and when, so a reader can open the source."""
    args = invocation.args
    data = invocation.client.get("/v1/search", {"q": args.query, "limit": args.limit, "mode": args.mode})
    if data.get("degraded") and not invocation.args.json:
        invocation.warn(f"search degraded: {format_cell(data['degraded'])}")
    return invocation.answer(data, _hit_lines)


def context(invocation: Invocation) -> int:
    """The budgeted memory context an agent would inject for a session and query, to check what it sees."""
    args = invocation.args
    data = invocation.client.get("/v1/context", {"session": args.key, "query": args.query,
                                                 "budget_tokens": args.budget})
    if data.get("warning") and not invocation.args.json:
        invocation.warn(str(data["warning"]))
    return invocation.answer(data, _context_lines)


def _hit_lines(data: Mapping[str, Any]) -> list[str]:
    hits = data.get("hits") or []
    lines = ([f"note: {format_cell(data['fallback'])}"] if data.get("fallback") else []) + ([] if hits else ["no hits"])
    for number, hit in enumerate(hits, 1):
        score = hit.get("score")
        score_text = f"{score:.3f}" if isinstance(score, (int, float)) else format_cell(score)
        lines.append(f"{number}. {format_location(hit)}  {format_cell(hit.get('when'))}  "
                     f"[{format_cell(hit.get('source'))}, score {score_text}]")
        lines.extend(f"   {line}" for line in str(hit.get("snippet") or "").strip().splitlines())
    return lines


def _context_lines(data: Mapping[str, Any]) -> list[str]:
    text = str(data.get("text") or "")
    return [text.removesuffix("\n")] if text else []
