"""scripts/bench_floor.py: its parts measured for real at small sizes, and floors that follow from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_floor.py"


def test_small_run_measures_every_part_and_derives_both_floors_from_them(tmp_path):
    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--messages", "400", "--sessions", "6", "--per-session", "30",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    long, many = figures["long"], figures["reconcile"]
    assert long["messages"] == 400 and long["unarchived_after"] == 0  # the archive really ran, all of it
    assert many["sessions"] == 6 and many["messages_per_session"] == 30
    assert many["parse_processes"] == 0  # 6 new files: parsed in the daemon, as the daemon would
    for part in (long, many):
        assert part["cores"] >= 1 and part["today_seconds"] > 0 and part["counting_wall"] > 0
        assert part["counting_child_cpu"] > 0  # the texts were counted in a process of their own
    assert long["parse_cpu"] > 0 and long["parse_wall"] > 0 and long["archive_cpu"] > 0
    # the floors are the parts' figures put together: the ones that wait for each other, and all of them spread
    serial = max(long["parse_wall"], long["counting_wall"]) + long["writes_wall"] + long["archive_wall"]
    spread = (long["parse_cpu"] + long["writes_cpu"] + long["counting_child_cpu"] + long["archive_cpu"]) / long["cores"]
    assert abs(long["serial_floor_seconds"] - serial) < 0.03 and abs(long["cpu_floor_seconds"] - spread) < 0.03
    assert abs(many["serial_floor_seconds"] - max(many["reconcile_own_wall"], many["counting_wall"])) < 0.03
    spread = (many["reconcile_own_cpu"] + many["counting_child_cpu"]) / many["cores"]
    assert abs(many["cpu_floor_seconds"] - spread) < 0.03
    assert long["goal_seconds"] == 400 / 20_000 and many["goal_seconds"] == 6.0
    assert long["goal_is"] in done.stdout and many["goal_is"] in done.stdout
    assert "the real scan" in done.stdout and "the real reconcile" in done.stdout


def test_a_reconcile_with_parse_processes_measures_them_and_the_writes_alone(tmp_path):
    """16 new files on two cores or more, daemon.parse_processes 2: the files are parsed in processes, and so are
    they in the parts measured."""
    from nanobotd.sessions.parsepool import MIN_NEW_FILES, processes_for

    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "reconcile", "--sessions", str(MIN_NEW_FILES),
                           "--per-session", "20", "--parse-processes", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    many = json.loads(out.read_text())["reconcile"]
    assert many["parse_processes"] == processes_for(many["cores"], 2)
    if not many["parse_processes"]:
        assert many["counting_wall"] > 0
        return
    assert many["parsed"] == MIN_NEW_FILES and many["parsing_child_cpu"] > 0 and many["parsing_wall"] > 0
    assert many["reconcile_child_cpu"] > 0  # the real reconcile's files were parsed in its children too
    assert abs(many["serial_floor_seconds"] - max(many["reconcile_own_wall"], many["parsing_wall"])) < 0.03
    spread = (many["reconcile_own_cpu"] + many["parsing_child_cpu"]) / many["cores"]
    assert abs(many["cpu_floor_seconds"] - spread) < 0.03
    assert "parse processes" in done.stdout and many["goal_is"] in done.stdout
