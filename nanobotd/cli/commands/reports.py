"""Commands that report on the daemon's work: audit (memory layout and fixes) and observe (job metrics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.cli.invocation import Invocation
from nanobotd.cli.render import format_cell, format_fields, format_rows

METRIC_COLUMNS = [("KIND", "kind"), ("WORKSPACE", "workspace"), ("TOTAL", "total"), ("WRITTEN", "written"),
                  ("NO_CHANGE", "no_change"), ("GUARD_REJ", "guard_rejected"), ("RAW", "raw_fallback"),
                  ("ERROR", "error"), ("TOKENS", "tokens"), ("P50_MS", "latency_ms_p50"),
                  ("P95_MS", "latency_ms_p95"), ("RESTORED", "restored")]


def audit(invocation: Invocation) -> int:
    """Each workspace's memory layout, state and problems with their fixes, to repair what the jobs trip over."""
    return invocation.answer(invocation.client.get("/v1/audit"), _audit_lines)


def observe(invocation: Invocation) -> int:
    """Per-job outcome counts, tokens and latency over a period, to see whether the jobs earn their keep."""
    return invocation.answer(invocation.client.get("/v1/metrics", {"since": invocation.args.since}),
                             _metric_lines)


def prometheus(invocation: Invocation) -> int:
    """The daemon's figures in the Prometheus text format, for node exporter's textfile collector."""
    invocation.stdout.write(invocation.client.text("/metrics"))
    return 0


def _audit_lines(data: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for index, workspace in enumerate(data.get("workspaces") or []):
        if index:
            lines.append("")
        lines.append(f"workspace {workspace.get('name', '?')}")
        lines.extend(f"  {line}" for line in workspace.get("plan") or [])
        lines.extend(format_fields(workspace.get("state") or {}, indent="  "))
        problems = workspace.get("problems") or []
        lines.append(f"  problems: {len(problems) or 'none'}")
        for problem in problems:
            lines.append(f"  - {format_cell(problem.get('problem'))}")
            lines.append(f"    fix: {format_cell(problem.get('fix'))}")
    return lines


def _metric_lines(data: Mapping[str, Any]) -> list[str]:
    twice = data.get("archived_twice") or {}
    return [f"since {format_cell(data.get('since'))}",
            *format_rows(METRIC_COLUMNS, data.get("rows") or [], "no runs in this period"),
            *_restore_lines(data.get("restores") or {}),
            *_reason_lines(data.get("rows") or []),
            *_missed_lines(data.get("rows") or []),
            *(f"archived twice in {name}: {count} message(s) (goal: 0)" for name, count in twice.items())]


def _restore_lines(restores: Mapping[str, Any]) -> list[str]:
    """`restores: 3 (restored 3: consolidate 2, dream 1)`, refusals and failures named."""
    if not restores.get("total"):
        return ["restores: none"]
    outcomes = ", ".join(f"{outcome} {count}" for outcome, count in sorted((restores.get("by_outcome") or {}).items()))
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted((restores.get("by_kind") or {}).items()))
    return [f"restores: {restores['total']} ({outcomes}){'; undid ' + kinds if kinds else ''}"]


def _missed_lines(rows: list[Mapping[str, Any]]) -> list[str]:
    """Compactions that came while the cycle's flush had only failed: facts the daily note never got."""
    return [f"flushes missed in {row.get('workspace')}: {row['missed_before_compaction']} compaction(s) came "
            f"before a failed flush could run again (goal: 0)"
            for row in rows if row.get("missed_before_compaction")]


def _reason_lines(rows: list[Mapping[str, Any]]) -> list[str]:
    """Why runs fell back to raw, were refused by the guard, or failed: the top reasons per row."""
    lines = []
    for row in rows:
        for key, label in (("fallback_reasons", "raw fallback"), ("guard_reasons", "guard refusal"),
                           ("error_reasons", "error")):
            for reason, count in (row.get(key) or {}).items():
                lines.append(f"{label} in {row.get('kind')}/{row.get('workspace')}: {format_cell(reason)} (x{count})")
    return lines
