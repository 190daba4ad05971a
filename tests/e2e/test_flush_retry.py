"""A flush whose LLM call fails does not use up the cycle's flush: a real daemon, the project's fake LLM server
answering errors and then facts, and `observe` counting the compactions that came with no flush done."""

from __future__ import annotations

import time

from tests.support.daemonproc import FIRST_LLM_CALL_SECONDS
from tests.support.fakellm import FakeLLM, HttpError, Text
from tests.support.workspace import conversation, make_workspace, write_session

FACTS = "## Decisions\n- Backups go to the cold bucket.\n"


def flush_config(fake: FakeLLM, *, retries: int, retry_seconds: float) -> str:
    """Owner mode: flush at 2,000 tokens of tail, archive only at ~28,000 (never in these tests)."""
    return f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
context_window = 30000
max_tokens = 1000

[consolidation]
reserve_floor = 26000
soft_threshold = 2000
flush_retries = {retries}
flush_retry_seconds = {retry_seconds}
"""


def flush_runs(daemon) -> list[dict]:
    runs = daemon.ctl_json("runs", "--kind", "flush", "--all")["runs"]
    return sorted((run for run in runs if run["state"] in ("finished", "failed")), key=lambda run: run["started_at"])


def test_a_flush_whose_llm_call_failed_is_tried_again_and_writes_the_note(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    with FakeLLM(default=Text(FACTS)) as fake:
        fake.push(HttpError(500))
        daemon = daemon_process(workspace, extra_config=flush_config(fake, retries=3, retry_seconds=0.5))
        write_session(sessions, "cli:a", conversation(40, words=40))
        daemon.start()
        runs = daemon.wait_for(lambda: [run["outcome"] for run in flush_runs(daemon)] == ["error", "written"]
                               and flush_runs(daemon), timeout=FIRST_LLM_CALL_SECONDS)
        assert runs[0]["state"] == "failed"
        note = workspace / "memory" / (time.strftime("%Y-%m-%d") + ".md")
        assert "cold bucket" in note.read_text()
        assert daemon.session("cli:a")["flushed_cycle"] == daemon.session("cli:a")["compaction_cycle"]
        assert "flush of cli:a failed (1 so far this cycle); trying again" in daemon.log()


def test_retries_are_bounded_and_a_compaction_with_no_flush_done_is_counted(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    with FakeLLM(default=HttpError(503)) as fake:
        daemon = daemon_process(workspace, extra_config=flush_config(fake, retries=1, retry_seconds=0.25))
        write_session(sessions, "cli:a", conversation(40, words=40))
        daemon.start()
        daemon.wait_for(lambda: len(flush_runs(daemon)) >= 2, timeout=FIRST_LLM_CALL_SECONDS)
        time.sleep(1.5)  # three times the next backoff (0.5 s): no third attempt comes
        assert [run["outcome"] for run in flush_runs(daemon)] == ["error", "error"]
        assert daemon.ctl_json("observe")["rows"][0].get("missed_before_compaction", 0) == 0
        proc = daemon.ctl("consolidate", "cli:a", "--wait")
        assert proc.returncode == 0, proc.stderr
        rows = {row["kind"]: row for row in daemon.ctl_json("observe")["rows"]}
        assert rows["flush"]["missed_before_compaction"] == 1
        assert rows["flush"]["error"] == 2 and rows["flush"]["total"] == 2  # the miss is no extra attempt
        assert "flushes missed in ws: 1 compaction(s)" in daemon.ctl("observe").stdout
