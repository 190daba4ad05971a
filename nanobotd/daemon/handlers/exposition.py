"""GET /metrics: the daemon's figures in the Prometheus text format, for users who already run Prometheus.
prometheus_client is imported in the handler, paid only when scraped; figures are read afresh into a fresh registry."""

from __future__ import annotations

from nanobotd.api.app import Request, Response
from nanobotd.daemon.core import Core
from nanobotd.state import metrics

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
WORKSPACE_GAUGES = (
    ("sessions_watched", "nanobotd_sessions_watched", "Sessions nanobotd tracks (deleted ones left out)."),
    ("unarchived_messages", "nanobotd_unarchived_messages", "Messages not yet archived into history."),
    ("unarchived_tokens", "nanobotd_unarchived_tokens", "Tokens of the messages not yet archived."),
    ("corrupt_lines", "nanobotd_corrupt_lines", "Unreadable lines in session files."),
    ("archived_twice", "nanobotd_archived_twice", "Messages archived by both the agent and nanobotd (goal: 0)."),
)


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


ROUTES = [("GET", "/metrics", prometheus)]
