"""A real daemon among hostile neighbours: a state folder on another filesystem, a second daemon on the same state
and workspace, a socket folder squatted by another user, hundreds of clients at once."""

from __future__ import annotations

from tests.support.mounts import tmpfs
from tests.support.workspace import conversation, history_entries, make_workspace, write_session


def status_of(proc) -> dict:
    return proc.ctl_json("status")["workspaces"][0]


def test_a_state_folder_on_its_own_tmpfs_tracks_spools_and_archives_what_the_agent_drops(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    with tmpfs(tmp_path / "state"):
        proc = daemon_process(workspace)
        proc.start()
        write_session(sessions, "cli:a", conversation(6))
        proc.wait_for(lambda: (proc.session("cli:a") or {}).get("unarchived_messages") == 6)
        write_session(sessions, "cli:a", conversation(10))  # replaced by a rename: a link cannot cross mounts
        proc.wait_for(lambda: (proc.session("cli:a") or {}).get("unarchived_messages") == 10)
        write_session(sessions, "cli:a", [])  # /new: the ten messages leave the file, archived from the spool
        proc.wait_for(lambda: len(history_entries(workspace)) > 0, timeout=30)
        text = "\n".join(entry.get("content", "") for entry in history_entries(workspace))
        assert all(f"M-{index} " in text for index in range(10))
        status = status_of(proc)
        assert status["scan_errors"] == 0 and status["last_scan_error"] is None
        assert "failed: [Errno 18]" not in proc.log()
        assert proc.stop() == 0


def test_status_says_scans_fail_and_what_the_last_failure_said(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    proc = daemon_process(workspace)
    (proc.state_dir).mkdir()
    (proc.state_dir / "held").write_text("a file where the held versions' folder belongs\n")
    write_session(sessions, "cli:a", conversation(4))
    proc.start()
    failing = proc.wait_for(lambda: status_of(proc)["scan_errors"] > 0 and status_of(proc))
    assert failing["sessions_watched"] == 0
    last = failing["last_scan_error"]
    assert last["path"].endswith(".jsonl") and "File exists" in last["error"] and last["at"]
    text = proc.ctl("status").stdout
    assert "scans" in text and "FAILING" in text and "File exists" in text, text
    before = failing["scan_errors"]
    proc.wait_for(lambda: status_of(proc)["scan_errors"] > before, timeout=10)  # every reconcile says it again
    assert proc.stop() == 0
