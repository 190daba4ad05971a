"""Reports: the audit of every workspace and the outcome metrics."""

from __future__ import annotations

import asyncio

from nanobotd.api.app import ApiError, Request
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import named_workspaces
from nanobotd.jobs import audit, lifecycle
from nanobotd.state import metrics


async def audit_report(core: Core, request: Request) -> dict:
    """Every workspace named (else all): its state and problems, each with its fix."""
    workspaces = []
    for workspace in named_workspaces(core, request):
        plan = await lifecycle.plan(workspace.env)
        totals = workspace.tracker.totals()
        extra_state = dict(totals, git=workspace.git.health(), search=workspace.search_status())
        workspaces.append(await asyncio.to_thread(
            audit.audit_workspace, workspace.settings, store=core.store, now=core.now(),
            lifecycle_plan=plan.get("plan", []), extra_state=extra_state, agent=workspace.agent,
            companion=workspace.mode == "companion", archived_twice=totals["archived_twice"]))
    return {"workspaces": workspaces}


async def outcome_metrics(core: Core, request: Request) -> dict:
    """Job outcomes since `since` (default 7d) and archived twice per workspace."""
    workspaces = named_workspaces(core, request)  # an unknown workspace is a 404 here too
    try:
        since = metrics.parse_since(request.query.get("since") or "7d")
    except ValueError as exc:
        raise ApiError(400, "bad_param", str(exc)) from None
    now = core.clock()
    summary = metrics.summarize_outcomes(core.store, since=now - since, now=now)
    summary["archived_twice"] = {workspace.name: workspace.tracker.totals()["archived_twice"]
                                 for workspace in workspaces}
    return summary


ROUTES = [("GET", "/v1/audit", audit_report), ("GET", "/v1/metrics", outcome_metrics)]
