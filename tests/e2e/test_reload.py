"""SIGHUP reloads through a real daemon while its jobs run."""

from __future__ import annotations

import signal
import time

from tests.support.histories import archived_markers
from tests.support.workspace import conversation, make_workspace, write_session

MESSAGES = 800
SMALL_CONTEXT = "[llm]\ncontext_window = 8000\nmax_tokens = 1000\n"


def reload(daemon, config: str, reloads: int) -> None:
    daemon.config_path.write_text(config)
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: daemon.log().count("config reloaded") >= reloads)


def removed_while_it_consolidates(tmp_path, daemon_process, job_stop_seconds: float):
    """A daemon with a second workspace whose budget consolidation of 800 messages (a context window of 8,000
    tokens: dozens of chunks) is held after its first history append (until *tmp_path*/release exists); returns
    (daemon, its config without the workspace, with it, the workspace)."""
    first, _ = make_workspace(tmp_path)
    workspace, sessions = make_workspace(tmp_path / "two")
    daemon = daemon_process(first, env={"NANOBOTD_FAULTS": f"consolidate.appended=hold:{tmp_path / 'release'}"},
                            extra_config=f"job_stop_seconds = {job_stop_seconds}\n\n{SMALL_CONTEXT}")
    alone = daemon.config_path.read_text()
    both = alone + f'\n[[workspaces]]\npath = "{workspace}"\nname = "two"\nconsolidation = {{ mode = "owner" }}\n'
    daemon.config_path.write_text(both)
    write_session(sessions, "cli:a", conversation(MESSAGES, tag="a", words=30))
    daemon.start()
    daemon.wait_reconciled()
    daemon.wait_for(lambda: daemon.api("/v1/sessions/cli%3Aa?workspace=two"), timeout=60)
    daemon.wait_for(lambda: "fault point consolidate.appended: holding" in daemon.log(), timeout=30)
    return daemon, alone, both, workspace


def settles_with_everything_archived_once(daemon, workspace) -> None:
    daemon.wait_for(lambda: daemon.api("/v1/sessions/cli%3Aa?workspace=two"), timeout=30)
    daemon.ctl("--workspace", "two", "consolidate", "cli:a")
    markers = archived_markers(workspace)
    assert sorted(set(markers)) == sorted({f"A-{index} " for index in range(MESSAGES)})
    assert len(markers) == MESSAGES  # none archived twice
    before = len(daemon.ctl_json("runs", "--all", "--limit", "1000")["runs"])
    time.sleep(3)
    assert len(daemon.ctl_json("runs", "--all", "--limit", "1000")["runs"]) - before < 5
    session = daemon.api("/v1/sessions/cli%3Aa?workspace=two")["session"]
    assert session["unarchived_messages"] == 0, session


def test_a_reload_removing_a_workspace_waits_for_its_consolidation_and_adding_it_back_settles(
        tmp_path, daemon_process):
    daemon, alone, both, workspace = removed_while_it_consolidates(tmp_path, daemon_process, 60)
    daemon.config_path.write_text(alone)
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: "workspace two removed from the config" in daemon.log())
    time.sleep(0.5)
    assert "config reloaded" not in daemon.log()  # the reload waits for the run it holds
    (tmp_path / "release").touch()
    daemon.wait_for(lambda: "config reloaded" in daemon.log(), timeout=30)
    runs = daemon.ctl_json("runs", "--all", "--limit", "1000")["runs"]
    assert [run["state"] for run in runs if run["workspace"] == "two"][0] == "finished", runs
    reload(daemon, both, 2)
    settles_with_everything_archived_once(daemon, workspace)


def test_a_consolidation_cut_short_by_a_reload_is_finished_when_its_workspace_comes_back(tmp_path, daemon_process):
    daemon, alone, both, workspace = removed_while_it_consolidates(tmp_path, daemon_process, 1)
    reload(daemon, alone, 1)  # the held run is cancelled after job_stop_seconds
    reload(daemon, both, 2)
    (tmp_path / "release").touch()
    settles_with_everything_archived_once(daemon, workspace)


def test_a_consolidation_cut_short_by_a_stop_is_finished_when_a_reload_brings_its_workspace_back(
        tmp_path, daemon_process):
    daemon, alone, both, workspace = removed_while_it_consolidates(tmp_path, daemon_process, 1)
    daemon.stop()  # the held run is cut short after job_stop_seconds
    daemon.config_path.write_text(alone)
    daemon.start()
    daemon.wait_for(lambda: "which the config no longer has, was interrupted" in daemon.log())
    reload(daemon, both, 1)
    (tmp_path / "release").touch()
    settles_with_everything_archived_once(daemon, workspace)


def test_a_workspace_moved_and_reloaded_at_its_new_path_shows_a_healthy_watcher_and_archives_once(
        tmp_path, daemon_process):
    """The user moves the workspace folder (sessions inside it) and points the config at the new path: the folders
    of the old path are no longer watched, so the watcher is not reported unhealthy for a folder nothing uses."""
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:w", conversation(6, tag="a"))
    daemon = daemon_process(workspace, extra_config='[llm]\nmodel = "none"\n')
    daemon.start()
    daemon.wait_reconciled()
    assert daemon.ctl("consolidate", "cli:w").returncode == 0
    moved = tmp_path / "moved workspace"
    workspace.rename(moved)
    reload(daemon, daemon.config_path.read_text().replace(f'path = "{workspace}"', f'path = "{moved}"'), 1)
    daemon.wait_for(lambda: daemon.ctl_json("status")["workspaces"][0]["last_reconcile"])
    write_session(moved / "sessions", "cli:w", conversation(8, tag="a"))
    daemon.wait_for(lambda: (daemon.session("cli:w") or {}).get("unarchived_messages") == 2)
    status = daemon.ctl_json("status")["workspaces"][0]
    assert status["path"] == str(moved) and status["watcher"]["healthy"], status["watcher"]
    assert daemon.ctl("consolidate", "cli:w").returncode == 0
    assert sorted(archived_markers(moved)) == sorted(f"A-{index} " for index in range(8))  # each once
