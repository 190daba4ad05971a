"""scripts/bench_table.py: the one table of every benchmark figure, built from sample run files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_table.py"


def run_table(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def write_runs(folder: Path) -> Path:
    """Three burst runs, two consolidate runs (one without the daemon part), one unreadable search file."""
    folder.mkdir(parents=True)
    for number, (share, ratio) in enumerate([(0.97, 1.05), (0.91, 1.2), (0.99, 1.02)], start=1):
        (folder / f"burst-{number}.json").write_text(json.dumps({
            "sizes": {"burst_sessions": 50}, "burst": {"llm_utilisation": share, "total_over_ideal": ratio,
                                                       "poll_errors": 0}}))
    (folder / "consolidate-1.json").write_text(json.dumps({
        "sizes": {"offline_messages": 100000},
        "offline": {"end_to_end_messages_per_second": 25000, "vm_hwm_mb": 160.0},
        "daemon": {"end_to_end_messages_per_second": 900}}))
    (folder / "consolidate-2.json").write_text(json.dumps({
        "sizes": {"offline_messages": 100000}, "offline": {"end_to_end_messages_per_second": 15000,
                                                           "vm_hwm_mb": 140.0}}))
    (folder / "search-1.json").write_text("{not json")
    (folder / "search-2.json").write_text(json.dumps({"history_entries": 100000, "sessions": 1000,
                                                      "builtin": {"p50_ms": 2.5}}))
    (folder / "notes.txt").write_text("not a run file")
    return folder


def rows_by_figure(table: dict) -> dict[str, dict]:
    return {row["figure"]: row for row in table["rows"]}


def test_the_table_takes_median_and_min_over_runs_and_judges_the_median(tmp_path):
    runs = write_runs(tmp_path / "runs")
    answer = run_table(str(runs), "--json", str(tmp_path / "table.json"))
    assert answer.returncode == 0, answer.stderr
    rows = rows_by_figure(json.loads((tmp_path / "table.json").read_text()))
    busy = rows["burst: LLM slots busy"]
    assert (busy["median"], busy["min"], busy["unit"], busy["runs"], busy["result"]) == (97.0, 91.0, "%", 3, "pass")
    ratio = rows["burst: total / ideal time"]
    assert (ratio["median"], ratio["min"], ratio["result"]) == (1.05, 1.02, "pass")
    offline = rows["offline consolidation (scan + archive)"]
    assert (offline["median"], offline["min"], offline["runs"], offline["result"]) == (20000, 15000, 2, "pass")
    peak = rows["offline consolidation, peak RSS"]
    assert (peak["median"], peak["min"], peak["result"]) == (150.0, 140.0, "pass"), "<= 150 meets 150"
    assert rows["burst: errors from GET /v1/sessions"]["result"] == "pass"


def test_a_figure_with_no_key_or_no_readable_file_is_missing_not_an_error(tmp_path):
    runs = write_runs(tmp_path / "runs")
    answer = run_table(str(runs), "--json", str(tmp_path / "table.json"))
    assert answer.returncode == 0, answer.stderr
    rows = rows_by_figure(json.loads((tmp_path / "table.json").read_text()))
    for name in ("builtin search p95", "builtin search p99", "cold start RSS", "RSS after the last LLM call (5 min)"):
        assert (rows[name]["result"], rows[name]["median"], rows[name]["runs"]) == ("missing", None, 0)
    # the daemon figure falls back to the end-to-end key the first run has
    daemon = rows["consolidation through the daemon"]
    assert (daemon["median"], daemon["runs"], daemon["result"]) == (900, 1, "fail")
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["sizes"]["search"] == {"history_entries": 100000, "sessions": 1000}, "top-level numbers as sizes"
    assert table["sizes"]["burst"] == {"burst_sessions": 50}
    line = next(line for line in answer.stdout.splitlines() if line.startswith("builtin search p99"))
    assert line.split()[-1] == "missing" and "< 20" in line


def test_compare_puts_two_tables_side_by_side(tmp_path):
    before_runs = write_runs(tmp_path / "before")
    after_runs = tmp_path / "after"
    after_runs.mkdir()
    (after_runs / "burst-1.json").write_text(json.dumps({"burst": {"llm_utilisation": 0.5}}))
    for name, folder in (("before", before_runs), ("after", after_runs)):
        assert run_table(str(folder), "--json", str(tmp_path / f"{name}.json")).returncode == 0
    answer = run_table("--compare", str(tmp_path / "before.json"), str(tmp_path / "after.json"))
    assert answer.returncode == 0, answer.stderr
    line = next(line for line in answer.stdout.splitlines() if line.startswith("burst: LLM slots busy"))
    assert line.split()[-5:] == ["97.0", "50.0", "%", "pass", "fail"]
    line = next(line for line in answer.stdout.splitlines() if line.startswith("burst: total / ideal"))
    assert line.split()[-5:] == ["1.05", "missing", "x", "pass", "missing"]


def test_without_a_folder_or_compare_it_says_what_to_give(tmp_path):
    answer = run_table()
    assert answer.returncode == 2 and "--compare" in answer.stderr
