"""nanobotd/cli/web/app.py: the Health page rendered from canned control API answers, as the browser gets it."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from nanobotd.cli.web.app import build_app
from nanobotd.cli.web.guard import Secrets

PORT = 8766
STATUS = {"workspaces": [{"name": "main", "path": "/srv/ws", "mode": "owner",
                          "search": {"builtin": {"units": 200, "files": 9, "db_bytes": 2 * 1048576}}}]}
DAILY = {"workspace": "main", "from": "2026-11-07", "outcomes": [], "history_entries": {"2026-11-20": 4},
         "last_outcomes": {},
         "samples": [{"day": "2026-11-18", "archived_twice": 0, "index_units": 100, "index_db_bytes": 1048576},
                     {"day": "2026-11-20", "archived_twice": 3, "index_units": 200, "index_db_bytes": 2097152}]}
METRICS = {"rows": [], "archived_twice": {"main": 3}, "restores": {"total": 0}}


class CannedClient:
    """The control client's get(), answering from canned data (the page's only way to the daemon)."""

    def __init__(self, asked: list[tuple[str, dict]]) -> None:
        self.asked = asked

    def get(self, path: str, params: dict | None = None) -> dict:
        self.asked.append((path, params or {}))
        return {"/v1/status": STATUS, "/v1/metrics/daily": DAILY, "/v1/metrics": METRICS}[path]


@pytest.fixture
def asked() -> list[tuple[str, dict]]:
    return []


@pytest.fixture
def page(asked) -> TestClient:
    keys = Secrets(PORT)
    client = TestClient(build_app(lambda name: CannedClient(asked), keys), base_url=f"http://127.0.0.1:{PORT}",
                        follow_redirects=False)
    assert client.get(f"/?token={keys.token}").status_code == 303
    return client


def figure(html: str, title: str) -> tuple[str, list[dict]]:
    """The aria-label of the chart titled *title* and its bars' geometry and labels."""
    found = re.search(r"<figure>\s*<figcaption><h2>" + re.escape(title) + r"</h2>.*?</figure>", html, re.S)
    assert found, f"no chart {title!r}"
    label = re.search(r'<svg [^>]*aria-label="([^"]*)"', found.group(0)).group(1)
    bars = [{"x": float(x), "y": float(y), "height": float(height), "label": text} for x, y, height, text in
            re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" class="[^"]*">'
                       r"<title>([^<]*)</title>", found.group(0))]
    return label, bars


def test_health_charts_archived_twice_and_index_size_by_day_with_gaps_for_days_without_a_sample(page, asked) -> None:
    html = page.get("/health").text
    assert ("/v1/metrics/daily", {"days": 14}) in asked
    label, bars = figure(html, "Archived twice (goal: 0)")
    assert label == ("Archived twice (goal: 0), sampled daily over 14 days: latest 3 messages, at most 3;"
                     " no sample on 12 day(s)")
    # day 12 of 14 sampled 0: a hairline on the axis; day 14 at 3 fills the height; the other days are gaps
    assert bars == [{"x": 252.4, "y": 95.0, "height": 1.0, "label": "2026-11-18: 0 messages"},
                    {"x": 298.1, "y": 0.0, "height": 96.0, "label": "2026-11-20: 3 messages"}]
    label, bars = figure(html, "Search index size")
    assert label == ("Search index size, sampled daily over 14 days: latest 200 units, at most 200;"
                     " no sample on 12 day(s)")
    assert bars == [{"x": 252.4, "y": 48.0, "height": 48.0, "label": "2026-11-18: 100 units (1.0 MB)"},
                    {"x": 298.1, "y": 0.0, "height": 96.0, "label": "2026-11-20: 200 units (2.0 MB)"}]
    assert html.count("<figure>") == 6  # beside the four charts of counts, drawn by the same template loop
