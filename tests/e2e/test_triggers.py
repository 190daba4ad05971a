"""Triggers through a real daemon: budget, flush threshold, idle."""

from __future__ import annotations

from tests.support.fakellm import FakeLLM, Responder, Text
from tests.support.workspace import conversation, make_workspace, write_session


def reply(request):
    system = request["messages"][0]["content"]
    if "NO_REPLY" in system:
        return Text("## Decisions\n- Use weekly log rotation\n\n## Topics\n- Disk usage on kestrel")
    return Text("- [durable] discussed disk usage")


def test_flush_then_consolidation_fire_at_their_thresholds_and_idle_sessions_get_archived(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    with FakeLLM(default=Responder(reply)) as fake:
        proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
context_window = 6000
max_tokens = 1000

[consolidation]
reserve_floor = 1000
soft_threshold = 500
idle_minutes = 0.05
""")
        try:
            proc.start()
            write_session(sessions, "cli:big", conversation(120, words=10))
            runs = proc.wait_for(lambda: {run["kind"] for run in proc.ctl_json("runs")["runs"]
                                          if run["state"] == "finished"} >= {"flush", "consolidate"}, timeout=60)
            assert runs
            notes = list((workspace / "memory").glob("2*.md"))
            assert notes and "Use weekly log rotation" in notes[0].read_text()
            session = proc.session("cli:big")
            assert session["unarchived_tokens"] <= session["budget"]
            write_session(sessions, "cli:quiet", conversation(4))
            proc.wait_for(lambda: (proc.session("cli:quiet") or {}).get("unarchived_messages") == 0, timeout=30)
            reasons = [run for run in proc.ctl_json("runs", "--limit", "100")["runs"]
                       if run["session_key"] == "cli:quiet"]
            assert reasons
        finally:
            proc.kill()


def test_a_session_saved_while_the_clock_was_ahead_is_archived_once_idle_after_the_clock_is_set_back(
        tmp_path, daemon_process):
    """The clock was an hour fast when the agent last saved the session (a VM restored, NTP not yet synced), and
    has since been set back: the file's time lies an hour ahead. Its idle time counts from when the daemon saw it,
    so it is archived after idle_minutes, not an hour later."""
    import os
    import time

    workspace, sessions = make_workspace(tmp_path)
    proc = daemon_process(workspace, extra_config='[llm]\nmodel = "none"\n\n[consolidation]\nidle_minutes = 0.05\n')
    proc.start()
    proc.wait_reconciled()
    path = write_session(sessions, "cli:ahead", conversation(4))
    ahead = time.time() + 3600
    os.utime(path, (ahead, ahead))
    proc.wait_for(lambda: (proc.session("cli:ahead") or {}).get("unarchived_messages") == 0, timeout=30)
    assert [run["kind"] for run in proc.ctl_json("runs")["runs"]] == ["consolidate"]
