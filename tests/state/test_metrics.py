"""Outcome metrics over a scripted day of outcome rows and runs."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from nanobotd.state.metrics import daily_samples, parse_since, percentile, record_daily_sample, summarize_outcomes
from nanobotd.state.store import StateStore

DAY_START = datetime(2026, 6, 15, 0, 0)
NOW = DAY_START + timedelta(hours=23)


class Clock:
    def __init__(self):
        self.value = DAY_START.timestamp()

    def __call__(self) -> float:
        return self.value

    def at(self, hour: float) -> None:
        self.value = (DAY_START + timedelta(hours=hour)).timestamp()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    opened = StateStore(tmp_path / "state", clock=clock).open()
    yield opened
    opened.close()


def scripted_day(store: StateStore, clock: Clock) -> str:
    """7 consolidations written, a raw fallback, 2 errors; a dream day with a guard hit; a restore."""
    clock.at(-48)
    store.record_outcome("consolidate", "main", "written", tokens=999, latency_ms=1.0)  # outside the window
    first_run = None
    for number in range(7):
        clock.at(1 + number)
        run_id = store.create_run("consolidate", "main", session_key="telegram:1")
        first_run = first_run or run_id
        store.record_outcome("consolidate", "main", "written", run_id=run_id, tokens=1000,
                             latency_ms=100.0 * (number + 1))
    clock.at(9)
    store.record_outcome("consolidate", "main", "raw_fallback", reason="LLM timeout", tokens=0)
    clock.at(10)
    store.record_outcome("consolidate", "main", "error", reason="LLM http (HTTP 500)", latency_ms=1000.0)
    store.record_outcome("consolidate", "main", "error", reason="LLM http (HTTP 500)", latency_ms=3000.0)
    clock.at(4.25)
    store.record_outcome("dream", "main", "written", tokens=5000, latency_ms=20000.0)
    store.record_outcome("dream", "main", "written", tokens=7000, latency_ms=40000.0)
    store.record_outcome("dream", "main", "guard_rejected", reason="edit drops section ## Preferences",
                         tokens=300, latency_ms=900.0)
    store.record_outcome("dream", "main", "no_change", tokens=200, latency_ms=500.0)
    store.record_outcome("flush", "other", "no_change", tokens=50, latency_ms=80.0)
    clock.at(12)
    restore = store.create_run("restore", "main", manifest={"target": first_run})
    store.record_outcome("consolidate", "main", "restored", run_id=restore)  # not an update attempt
    store.finish_run(restore, state="finished", outcome="restored")
    failed = store.create_run("restore", "main", manifest={"target_run_id": first_run})
    store.finish_run(failed, state="failed", outcome="error")
    clock.at(30)
    store.record_outcome("consolidate", "main", "written", tokens=999, latency_ms=1.0)  # after "now"
    return first_run


def test_counts_rates_and_latency_percentiles_are_exact(store, clock):
    scripted_day(store, clock)
    report = summarize_outcomes(store, since=DAY_START.timestamp(), now=NOW.timestamp())
    assert report["since"] == "2026-06-15T00:00:00"
    rows = {(row["kind"], row["workspace"]): row for row in report["rows"]}
    assert list(rows) == [("consolidate", "main"), ("dream", "main"), ("flush", "other")]
    consolidate = rows[("consolidate", "main")]
    assert {key: consolidate[key] for key in ("total", "written", "no_change", "guard_rejected", "raw_fallback",
                                              "error", "tokens", "restored")} == {
        "total": 10, "written": 7, "no_change": 0, "guard_rejected": 0, "raw_fallback": 1, "error": 2,
        "tokens": 7000, "restored": 1,
    }
    assert consolidate["rates"] == {"written": 0.7, "no_change": 0.0, "guard_rejected": 0.0, "raw_fallback": 0.1,
                                    "error": 0.2}
    # Latencies 100..700, 1000, 3000 (the raw fallback had none): p50 is the 5th, p95 interpolates 1000..3000.
    assert consolidate["latency_ms_p50"] == 500.0
    assert consolidate["latency_ms_p95"] == pytest.approx(2200.0)
    assert consolidate["fallback_reasons"] == {"LLM timeout": 1}
    assert consolidate["error_reasons"] == {"LLM http (HTTP 500)": 2}
    dream = rows[("dream", "main")]
    assert (dream["total"], dream["written"], dream["guard_rejected"], dream["no_change"]) == (4, 2, 1, 1)
    assert dream["rates"]["guard_rejected"] == 0.25
    assert dream["guard_reasons"] == {"edit drops section ## Preferences": 1}
    # Latencies 500, 900, 20000, 40000: the median lies halfway between 900 and 20000.
    assert dream["latency_ms_p50"] == 10450.0 and dream["restored"] == 0
    assert rows[("flush", "other")]["latency_ms_p95"] == 80.0


def test_every_restore_run_is_counted_by_outcome_and_by_the_kind_it_undid(store, clock):
    scripted_day(store, clock)
    report = summarize_outcomes(store, since=DAY_START.timestamp(), now=NOW.timestamp())
    assert report["restores"] == {"total": 2, "by_outcome": {"restored": 1, "error": 1},
                                  "by_kind": {"consolidate": 1}}


def test_a_window_without_rows_is_empty(store, clock):
    scripted_day(store, clock)
    since = (NOW + timedelta(days=5)).timestamp()
    assert summarize_outcomes(store, since=since, now=since + 60)["rows"] == []


def test_percentile_interpolates_linearly():
    assert percentile([], 0.5) is None
    assert percentile([10.0], 0.95) == 10.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


@pytest.mark.parametrize("text, seconds", [("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("2w", 1209600),
                                           (" 45s ", 45), ("1.5h", 5400), ("3D", 3 * 86400)])
def test_parse_since_reads_durations(text, seconds):
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d7", "7 days", "-1d", "1y"])
def test_parse_since_rejects_anything_else(text):
    with pytest.raises(ValueError, match="bad duration"):
        parse_since(text)


def test_a_days_later_sample_replaces_its_earlier_one_and_another_day_adds_a_row(store, clock) -> None:
    """One row a workspace and day: the figures of the day's latest sample; another day or workspace is its own row."""
    clock.at(1)
    record_daily_sample(store, "main", "2026-06-14", archived_twice=1, index_units=10, index_db_bytes=4096)
    record_daily_sample(store, "main", "2026-06-15", archived_twice=2, index_units=20, index_db_bytes=8192)
    clock.at(9)
    record_daily_sample(store, "main", "2026-06-15", archived_twice=3, index_units=25, index_db_bytes=12288)
    record_daily_sample(store, "other", "2026-06-15", archived_twice=0, index_units=7, index_db_bytes=1024)
    assert daily_samples(store, "main", "2026-06-01") == [
        {"day": "2026-06-14", "archived_twice": 1, "index_units": 10, "index_db_bytes": 4096},
        {"day": "2026-06-15", "archived_twice": 3, "index_units": 25, "index_db_bytes": 12288},
    ]
    assert daily_samples(store, "main", "2026-06-15") == [
        {"day": "2026-06-15", "archived_twice": 3, "index_units": 25, "index_db_bytes": 12288}]
    assert store.query("SELECT count(*), max(at) FROM daily_samples WHERE workspace = 'main'")[0] == (
        2, (DAY_START + timedelta(hours=9)).timestamp())


def test_a_database_from_before_daily_samples_gains_the_table(tmp_path) -> None:
    """A state database of schema 5 (an older nanobotd) opens and takes samples."""
    import sqlite3

    from nanobotd.state.store import MIGRATIONS

    (tmp_path / "state").mkdir()
    db = sqlite3.connect(tmp_path / "state" / "state.db", isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:5]):
        db.executescript("BEGIN;" + script + f"; PRAGMA user_version={number + 1}; COMMIT;")
    db.close()
    store = StateStore(tmp_path / "state").open()
    try:
        record_daily_sample(store, "main", "2026-06-15", archived_twice=0, index_units=1, index_db_bytes=2)
        assert daily_samples(store, "main", "2026-06-15")[0]["index_units"] == 1
    finally:
        store.close()
