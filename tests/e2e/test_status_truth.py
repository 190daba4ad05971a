"""`status` and `session KEY` tell the truth, through a real daemon: one budget (the one that decides), the last
LLM call's outcome and time, and a configured workspace folder that does not exist named in words."""

from __future__ import annotations

import json
import re

from tests.support.daemonproc import FIRST_LLM_CALL_SECONDS
from tests.support.fakellm import FakeLLM, HttpError
from tests.support.workspace import conversation, make_workspace, write_session


def test_session_and_status_show_the_agents_budget_beside_a_companion_agent(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    (sessions.parent.parent / "config.json").write_text(json.dumps(
        {"agents": {"defaults": {"contextWindowTokens": 50000, "maxTokens": 4000}}}))
    write_session(sessions, "cli:a", conversation(4))
    daemon = daemon_process(workspace, mode="auto").start()
    session = daemon.wait_for(lambda: daemon.session("cli:a"))
    status = daemon.ctl_json("status")["workspaces"][0]
    assert status["consolidation_mode"] == "companion"
    assert session["budget"] == status["budget"] == 50000 - 4000 - 1024
    assert session["flush_threshold"] == status["flush_threshold"]
    assert "the agent's" in session["budget_source"]
    assert re.search(rf"\n\s+budget\s+{50000 - 4000 - 1024} tokens, flush at", daemon.ctl("status").stdout)


def test_status_shows_that_the_last_llm_call_failed(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    with FakeLLM(default=HttpError(500)) as fake:
        daemon = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
""")
        write_session(sessions, "cli:a", conversation(4))
        daemon.start()
        daemon.wait_for(lambda: daemon.session("cli:a"))  # a flush of a session not seen yet is refused
        assert "no call yet" in daemon.ctl("status").stdout
        daemon.ctl("flush", "cli:a", "--wait", timeout=FIRST_LLM_CALL_SECONDS + 30)
        last = daemon.wait_for(lambda: daemon.ctl_json("status")["workspaces"][0]["llm_last_call"])
        assert last["ok"] is False and last["at"] and "500" in last["error"]
        llm_line = re.search(r"\n\s+llm\s+(.*)", daemon.ctl("status").stdout).group(1)
        assert llm_line.startswith(f"online ({fake.model}), LAST CALL FAILED at {last['at']}"), llm_line


def test_a_configured_workspace_folder_that_does_not_exist_is_named(tmp_path, daemon_process):
    missing = tmp_path / "no-such-workspace"
    daemon = daemon_process(missing).start()
    text = daemon.ctl("status").stdout
    assert f"({missing})  [MISSING: this folder does not exist" in text
    assert f"workspace ws: folder {missing} does not exist" in daemon.log()
