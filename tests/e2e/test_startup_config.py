"""Which settings a real daemon starts with: --workspace over the config file (the rest of the file kept), the
start-up log naming the file read, and nanobot's own workspace when there is neither file nor flag."""

from __future__ import annotations

import json

from tests.support.workspace import conversation, make_workspace, write_session

LLM_CONFIG = """
[llm]
model = "openai/configured-model"
api_base = "http://127.0.0.1:9/v1"
"""


def only_workspace(daemon) -> dict:
    workspaces = daemon.ctl_json("status")["workspaces"]
    assert len(workspaces) == 1, workspaces
    return workspaces[0]


def test_a_workspace_flag_keeps_the_config_files_name_and_llm(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(2))
    daemon = daemon_process(workspace, extra_config=LLM_CONFIG, default_config=True,
                            args=("--workspace", str(workspace))).start()
    status = only_workspace(daemon)
    assert status["name"] == "ws", "the file's name for this folder was dropped: its state would be orphaned"
    assert status["llm_model"] == "openai/configured-model" and status["llm_mode"] == "online"
    assert f"config file {daemon.config_path} read" in daemon.log()


def test_a_workspace_flag_for_another_folder_still_takes_the_files_llm(tmp_path, daemon_process):
    workspace, _ = make_workspace(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    daemon = daemon_process(workspace, extra_config=LLM_CONFIG, default_config=True,
                            args=("--workspace", str(other))).start()
    status = only_workspace(daemon)
    assert status["path"] == str(other) and status["llm_model"] == "openai/configured-model"
    assert "--workspace" in daemon.log() and "over the file's workspaces" in daemon.log()


def test_with_no_config_and_no_flag_nanobots_own_workspace_is_managed(tmp_path, daemon_process):
    home = tmp_path / "user-home"
    workspace, sessions = make_workspace(home / "bots")
    (home / ".nanobot").mkdir(parents=True)
    (home / ".nanobot" / "config.json").write_text(json.dumps({"agents": {"defaults": {"workspace": str(workspace)}}}))
    write_session(sessions, "cli:a", conversation(2))
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    daemon = daemon_process(workspace, default_config=True,
                            env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
                                 "XDG_STATE_HOME": str(tmp_path / "xdgstate")})
    daemon.config_path.unlink()  # no config file anywhere: only nanobot's own config.json says where to look
    daemon.socket = runtime / "nanobotd" / "nanobotd.sock"
    daemon.start()
    status = only_workspace(daemon)
    assert status["path"] == str(workspace)
    daemon.wait_for(lambda: daemon.session("cli:a"))
    log = daemon.log()
    assert "no config file found" in log and str(home / ".nanobot" / "config.json") in log


def test_with_no_config_and_no_nanobot_workspace_the_message_says_what_was_looked_for(tmp_path, daemon_process):
    home = tmp_path / "user-home"
    home.mkdir()
    workspace, _ = make_workspace(tmp_path)
    daemon = daemon_process(workspace, default_config=True, env={"HOME": str(home)})
    daemon.config_path.unlink()
    daemon.start(wait=False)
    assert daemon.proc.wait(timeout=30) == 2
    log = daemon.log()
    assert "no config file found" in log and str(home / ".nanobot" / "workspace") in log
    assert "--workspace DIR" in log
