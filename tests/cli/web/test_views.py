"""nanobotd/cli/web/views.py: token bars, day charts, diff lines and markdown, from plain data."""

from __future__ import annotations

from nanobotd.cli.web import views


def test_token_bars_are_fullest_first_and_say_where_they_stand() -> None:
    workspace = {"name": "ws", "budget": 1000, "flush_threshold": 800}
    rows = [{"workspace": "ws", "key": "a", "unarchived_tokens": 100, "state": "active"},
            {"workspace": "ws", "key": "b", "unarchived_tokens": 900, "state": "active"},
            {"workspace": "ws", "key": "c", "unarchived_tokens": 5000, "state": "active"},
            {"workspace": "ws", "key": "gone", "unarchived_tokens": 10, "state": "deleted"},
            {"workspace": "other", "key": "d", "unarchived_tokens": 1, "state": "active"}]
    bars = views.token_bars(rows, workspace)
    assert [(bar.key, bar.level, bar.percent) for bar in bars] == [("c", "over", 100.0), ("b", "flush", 90.0),
                                                                   ("a", "ok", 10.0)]
    assert bars[0].threshold_percent == 80.0


def test_a_day_chart_stacks_each_days_series_and_the_tallest_day_fills_it() -> None:
    days = views.day_range("2026-11-19", 3)
    assert days == ["2026-11-19", "2026-11-20", "2026-11-21"]
    chart = views.day_chart("c", days, {"2026-11-20": {"written": 3, "error": 1}, "2026-11-21": {"written": 2}})
    assert (chart.peak, chart.total, chart.series) == (4, 6, ["written", "error"])
    first = [bar for bar in chart.bars if bar.label.startswith("2026-11-20")]
    assert [bar.height for bar in first] == [72.0, 24.0] and first[1].y == 0.0
    assert views.day_chart("empty", days, {}).bars == []


def test_diff_lines_are_classed_by_what_they_are() -> None:
    patch = "diff --git a/U b/U\n--- a/U\n+++ b/U\n@@ -1 +1 @@\n-- Likes tea.\n+- Likes coffee.\n same"
    assert [line.css for line in views.diff_lines(patch)] == ["d-file", "d-file", "d-file", "d-hunk", "d-del",
                                                              "d-add", "d-ctx"]


def test_markdown_escapes_html_and_drops_script_links() -> None:
    render = views.markdown_renderer()
    html = render("# Hi\n\n<script>alert(1)</script>\n\n[x](javascript:alert(1))")
    assert "<h1>Hi</h1>" in html and "<script>" not in html and "href=\"javascript" not in html


def test_day_counts_put_flushes_beside_consolidations_or_one_kinds_outcomes_per_day() -> None:
    rows = [{"day": "2026-11-20", "kind": "flush", "outcome": "written", "count": 2},
            {"day": "2026-11-20", "kind": "flush", "outcome": "no_change", "count": 1},
            {"day": "2026-11-20", "kind": "consolidate", "outcome": "written", "count": 4},
            {"day": "2026-11-21", "kind": "dream", "outcome": "written", "count": 1}]
    assert views.day_counts(rows, ("flush", "consolidate"), "kind") == {"2026-11-20": {"flush": 3, "consolidate": 4}}
    assert views.day_counts(rows, ("flush",), "outcome") == {"2026-11-20": {"written": 2, "no_change": 1}}


def test_a_chart_of_daily_samples_tells_a_zero_from_a_day_without_a_sample() -> None:
    days = views.day_range("2026-11-19", 3)
    samples = [{"day": "2026-11-19", "archived_twice": 0}, {"day": "2026-11-21", "archived_twice": 2}]
    chart = views.day_chart("t", days, views.sample_series(samples, "archived_twice", "messages"), levels=True)
    assert [(bar.label, bar.height) for bar in chart.bars] == [("2026-11-19: 0 messages", 1.0),
                                                              ("2026-11-21: 2 messages", 96.0)]
    assert (chart.latest, chart.peak, chart.gaps) == (2, 2, 1)
    empty = views.day_chart("t", days, {}, levels=True)
    assert (empty.bars, empty.latest, empty.gaps) == ([], None, 3)
