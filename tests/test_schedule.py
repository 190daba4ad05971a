"""Cron scheduling: previous fire times, missed runs after downtime, and the daemon's catch-up."""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from zoneinfo import ZoneInfo

from nanobotd.daemon.scheduler import make_trigger, missed_run, previous_fire_time
from tests.support.daemonproc import DaemonProcess
from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import make_workspace

TZ = ZoneInfo("Europe/Paris")


def test_previous_fire_time_of_a_nightly_and_a_weekly_job():
    now = datetime(2026, 11, 22, 10, 0, tzinfo=TZ)
    assert previous_fire_time(make_trigger("15 4 * * *", TZ), now) == datetime(2026, 11, 22, 4, 15, tzinfo=TZ)
    assert previous_fire_time(make_trigger("0 5 * * mon", TZ), now) == datetime(2026, 11, 16, 5, 0, tzinfo=TZ)


def test_a_run_missed_while_down_is_detected_once():
    trigger = make_trigger("15 4 * * *", TZ)
    now = datetime(2026, 11, 22, 10, 0, tzinfo=TZ)
    two_days_ago = datetime(2026, 11, 20, 4, 16, tzinfo=TZ).timestamp()
    this_morning = datetime(2026, 11, 22, 4, 16, tzinfo=TZ).timestamp()
    assert missed_run(trigger, two_days_ago, now) is True
    assert missed_run(trigger, this_morning, now) is False
    assert missed_run(trigger, None, now) is False


def test_nightly_dream_missed_during_downtime_runs_once_at_start(tmp_path):
    workspace, _ = make_workspace(tmp_path)
    with FakeLLM(default=Text("[SKIP]")) as fake:
        proc = DaemonProcess(tmp_path, workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
""")
        try:
            proc.start()
            assert proc.ctl_json("runs", "--kind", "dream")["runs"] == []
            proc.stop()
            db = sqlite3.connect(proc.state_dir / "state.db")
            with db:
                db.execute("UPDATE job_state SET last_success=? WHERE job='dream'", (time.time() - 3 * 86400,))
            db.close()
            proc.start()
            runs = proc.wait_for(lambda: proc.ctl_json("runs", "--kind", "dream")["runs"], timeout=30)
            proc.wait_for(lambda: proc.ctl_json("runs", "--kind", "dream")["runs"][0]["state"] == "finished", 30)
            time.sleep(1)
            assert len(proc.ctl_json("runs", "--kind", "dream")["runs"]) == 1
            proc.stop()
            proc.start()
            time.sleep(1.5)
            assert len(proc.ctl_json("runs", "--kind", "dream")["runs"]) == 1, "caught up only once"
            assert runs[0]["kind"] == "dream"
        finally:
            proc.kill()
