"""What the templates draw, shaped from the daemon's answers: token bars, day charts, diff lines, markdown. Pure
functions of plain data, so the pages stay simple loops and these are tested without a server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

OUTCOME_ORDER = ("written", "no_change", "raw_fallback", "guard_rejected", "error")
CHART_WIDTH, CHART_HEIGHT = 320, 96
# (line prefixes, class) of a unified diff's lines, the first match wins; any other line is context.
DIFF_CLASSES = ((("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file"), "d-file"), ("@@", "d-hunk"),
                ("+", "d-add"), ("-", "d-del"))


@dataclass(frozen=True)
class TokenBar:
    """A session's unarchived tokens against its budget, with the flush threshold marked (percent of budget)."""

    key: str
    tokens: int
    budget: int
    flush_threshold: int

    @property
    def percent(self) -> float:
        return min(100.0, 100.0 * self.tokens / self.budget) if self.budget else 0.0

    @property
    def threshold_percent(self) -> float:
        return min(100.0, 100.0 * self.flush_threshold / self.budget) if self.budget else 0.0

    @property
    def level(self) -> str:
        """"over" past the budget, "flush" past the flush threshold, else "ok": the bar's colour and words."""
        if self.budget and self.tokens >= self.budget:
            return "over"
        return "flush" if self.flush_threshold and self.tokens >= self.flush_threshold else "ok"


def token_bars(sessions: Iterable[Mapping[str, Any]], workspace: Mapping[str, Any]) -> list[TokenBar]:
    """The workspace's live sessions, fullest first."""
    budget = int(workspace.get("budget") or 0)
    threshold = int(workspace.get("flush_threshold") or 0)
    bars = [TokenBar(str(row.get("key")), int(row.get("unarchived_tokens") or 0), budget, threshold)
            for row in sessions if row.get("workspace") == workspace.get("name") and row.get("state") != "deleted"]
    return sorted(bars, key=lambda bar: (-bar.tokens, bar.key))


@dataclass(frozen=True)
class Bar:
    """One stacked segment of a day's column."""

    x: float
    y: float
    width: float
    height: float
    label: str
    css: str


@dataclass(frozen=True)
class Chart:
    """A small bar chart as plain SVG geometry: one column a day, stacked by series. A chart of *levels* (a
    figure sampled once a day, not counted) has no total: it says the latest sample and the days without one."""

    title: str
    bars: list[Bar]
    days: list[str]
    peak: int
    total: int
    series: list[str]
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    levels: bool = False
    latest: int | None = None
    gaps: int = 0


def day_range(first: str, count: int) -> list[str]:
    """*count* days from *first* (YYYY-MM-DD), as text."""
    start = date.fromisoformat(first)
    return [(start + timedelta(days=offset)).isoformat() for offset in range(count)]


def day_chart(title: str, days: list[str], values: Mapping[str, Mapping[str, int]], *, levels: bool = False,
              notes: Mapping[str, str] | None = None) -> Chart:
    """A chart of *values* (day -> series -> count) over *days*, the tallest day filling the height. With *levels*
    (daily samples) a 0 gets a hairline, a day without a sample nothing: a gap, never a zero. *notes* extend labels."""
    series = [name for name in OUTCOME_ORDER if any(name in values.get(day, {}) for day in days)]
    series += sorted({name for day in days for name in values.get(day, {}) if name not in series})
    peak = max((sum(values.get(day, {}).values()) for day in days), default=0)
    slot = CHART_WIDTH / max(1, len(days))
    bars = []
    for index, day in enumerate(days):
        top = float(CHART_HEIGHT)
        for name in series:
            if levels and name not in values.get(day, {}):
                continue
            count = values.get(day, {}).get(name, 0)
            if not count and not levels:
                continue
            height = CHART_HEIGHT * count / peak if count else 1.0
            top -= height
            label = f"{day}: {count:,} {name.replace('_', ' ')}" + (f" ({notes[day]})" if notes and day in notes
                                                                    else "")
            bars.append(Bar(round(index * slot + 1, 1), round(top, 1), round(max(1.0, slot - 2), 1),
                            round(height, 1), label, f"s-{name}"))
    total = sum(sum(values.get(day, {}).values()) for day in days)
    if not levels:
        return Chart(title, bars, days, peak, total, series)
    sampled = [day for day in days if values.get(day)]
    latest = sum(values[sampled[-1]].values()) if sampled else None
    return Chart(title, bars, days, peak, total, series, levels=True, latest=latest, gaps=len(days) - len(sampled))


def sample_series(samples: Iterable[Mapping[str, Any]], field: str, name: str) -> dict[str, dict[str, int]]:
    """day -> {name: figure} of one field of GET /v1/metrics/daily's daily samples (a day without one is left
    out: a gap in its chart)."""
    return {str(row["day"]): {name: int(row.get(field) or 0)} for row in samples}


def day_counts(rows: Iterable[Mapping[str, Any]], kinds: tuple[str, ...], by: str) -> dict[str, dict[str, int]]:
    """day -> row[*by*] -> runs, of the job *kinds* named, from GET /v1/metrics/daily's outcome rows: by "outcome"
    for one kind's outcomes, by "kind" for flushes beside consolidations."""
    values: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.get("kind") in kinds:
            day = values.setdefault(str(row["day"]), {})
            day[str(row[by])] = day.get(str(row[by]), 0) + int(row["count"])
    return values


@dataclass(frozen=True)
class DiffLine:
    """One line of a patch and how to show it."""

    text: str
    css: str


def diff_lines(patch: str) -> list[DiffLine]:
    """A unified diff, line by line, classed as file header, hunk, added, removed or context."""
    return [DiffLine(text, next((css for prefixes, css in DIFF_CLASSES if text.startswith(prefixes)), "d-ctx"))
            for text in patch.splitlines()]


def markdown_renderer():
    """Markdown to HTML with raw HTML escaped (memory holds what chats said) and unsafe links dropped."""
    from markdown_it import MarkdownIt

    renderer = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    return renderer.render
