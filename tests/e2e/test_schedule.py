"""The daemon's catch-up of a nightly run missed while it was down."""

from __future__ import annotations

import sqlite3
import time

from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import make_workspace


def dream_runs(proc) -> list[dict]:
    """Every dream run, those that changed nothing included (a dream with nothing to read changes nothing)."""
    return proc.ctl_json("runs", "--all", "--kind", "dream")["runs"]


def test_nightly_dream_missed_during_downtime_runs_once_at_start(tmp_path, daemon_process):
    workspace, _ = make_workspace(tmp_path)
    with FakeLLM(default=Text("[SKIP]")) as fake:
        proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
""")
        try:
            proc.start()
            proc.wait_reconciled(1)
            assert dream_runs(proc) == []
            proc.stop()
            db = sqlite3.connect(proc.state_dir / "state.db")
            with db:
                db.execute("UPDATE job_state SET last_success=? WHERE job='dream'", (time.time() - 3 * 86400,))
            db.close()
            proc.start()
            runs = proc.wait_for(lambda: dream_runs(proc), timeout=30)
            proc.wait_for(lambda: dream_runs(proc)[0]["state"] == "finished", 30)
            proc.wait_reconciled(2)  # begins after missed runs were queued: a second would show
            assert len(dream_runs(proc)) == 1
            proc.stop()
            proc.start()
            proc.wait_reconciled(3)
            assert len(dream_runs(proc)) == 1, "caught up only once"
            assert runs[0]["kind"] == "dream"
        finally:
            proc.kill()
