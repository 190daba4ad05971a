"""Reports: the audit of every workspace, the outcome metrics, and the figures in the Prometheus text format
(prometheus_client is imported in its handler, paid only when scraped; figures are read into a fresh registry)."""

from __future__ import annotations

import asyncio

from nanobotd.api.app import ApiError, Request, Response
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import named_workspaces
from nanobotd.jobs import audit, lifecycle
from nanobotd.state import metrics

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
WORKSPACE_GAUGES = (
    ("sessions_watched", "nanobotd_sessions_watched", "Sessions nanobotd tracks (deleted ones left out)."),
    ("unarchived_messages", "nanobotd_unarchived_messages", "Messages not yet archived into history."),
    ("unarchived_tokens", "nanobotd_unarchived_tokens", "Tokens of the messages not yet archived."),
    ("corrupt_lines", "nanobotd_corrupt_lines", "Unreadable lines in session files."),
    ("archived_twice", "nanobotd_archived_twice", "Messages archived by both the agent and nanobotd (goal: 0)."),
)


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


async def prometheus(core: Core, request: Request) -> Response:
    """Every figure, read afresh, as Prometheus text: per-workspace gauges, job outcome counters, index size, uptime."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families = [GaugeMetricFamily("nanobotd_uptime_seconds", "Seconds since the daemon started.",
                                  value=core.uptime)]
    gauges = {name: GaugeMetricFamily(metric, text, labels=["workspace"]) for name, metric, text in WORKSPACE_GAUGES}
    index_units = GaugeMetricFamily("nanobotd_index_units", "Units in the builtin search index.", labels=["workspace"])
    index_bytes = GaugeMetricFamily("nanobotd_index_bytes", "Size of the builtin search index on disk.",
                                    labels=["workspace"])
    for workspace in core.workspaces.values():
        totals = workspace.tracker.totals()
        for name, family in gauges.items():
            family.add_metric([workspace.name], totals.get(name) or 0)
        stats = workspace.index.stats()
        index_units.add_metric([workspace.name], stats.get("units") or 0)
        index_bytes.add_metric([workspace.name], stats.get("db_bytes") or 0)
    outcomes = CounterMetricFamily("nanobotd_job_outcomes", "Memory update attempts by job kind and outcome.",
                                   labels=["kind", "workspace", "outcome"])
    for kind, workspace_name, outcome, count in metrics.outcome_totals(core.store):
        outcomes.add_metric([kind, workspace_name, outcome], count)
    families += [*gauges.values(), index_units, index_bytes, outcomes]

    class Figures:
        def collect(self):
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Figures())
    return Response(200, generate_latest(registry).decode("utf-8"), content_type=PROMETHEUS_TEXT)


ROUTES = [("GET", "/v1/audit", audit_report), ("GET", "/v1/metrics", outcome_metrics), ("GET", "/metrics", prometheus)]
