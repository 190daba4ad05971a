"""A real daemon among hostile neighbours: a state folder on another filesystem, a second daemon on the same state
and workspace, a socket folder squatted by another user, hundreds of clients at once."""

from __future__ import annotations

import os
import re
import threading

from nanobotd.cli.client import Client
from tests.support.mounts import tmpfs
from tests.support.workspace import conversation, history_entries, make_workspace, write_session


def status_of(proc) -> dict:
    return proc.ctl_json("status")["workspaces"][0]


def test_a_state_folder_on_its_own_tmpfs_tracks_spools_and_archives_what_the_agent_drops(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    with tmpfs(tmp_path / "state"):
        proc = daemon_process(workspace)
        proc.start()
        messages = conversation(12, words=1000)  # ~8 KB each: the first version is held in a streamed copy
        path = write_session(sessions, "cli:a", messages[:10])
        proc.wait_for(lambda: (proc.session("cli:a") or {}).get("unarchived_messages") == 10)
        assert [entry.stat().st_size for entry in (proc.state_dir / "held").iterdir()] == [path.stat().st_size]
        write_session(sessions, "cli:a", messages)  # replaced by a rename: two more rows, spooled as text
        proc.wait_for(lambda: (proc.session("cli:a") or {}).get("unarchived_messages") == 12)
        write_session(sessions, "cli:a", [])  # /new: the twelve messages leave the file, archived from the spool
        proc.wait_for(lambda: len(history_entries(workspace)) > 0, timeout=30)
        text = "\n".join(entry.get("content", "") for entry in history_entries(workspace))
        assert all(f"M-{index} " in text for index in range(12))
        status = status_of(proc)
        assert status["scan_errors"] == 0 and status["last_scan_error"] is None
        assert "failed: [Errno 18]" not in proc.log() and "cannot be archived" not in proc.log()
        assert proc.stop() == 0


def test_status_says_scans_fail_and_what_the_last_failure_said(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    proc = daemon_process(workspace)
    (proc.state_dir).mkdir()
    (proc.state_dir / "held").write_text("a file where the held versions' folder belongs\n")
    write_session(sessions, "cli:a", conversation(10, words=1000))  # a first version worth a held copy
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


def test_three_hundred_clients_at_once_all_get_their_answer(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(4))
    proc = daemon_process(workspace).start()
    clients = 300
    start = threading.Barrier(clients)
    failures: list[str] = []

    def ask() -> None:
        client = Client(proc.socket, timeout=30)
        start.wait()
        try:
            assert client.get("/v1/status")["pid"] == proc.proc.pid
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=ask) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [], f"{len(failures)} of {clients} failed, first: {failures[0]}"
    assert proc.stop() == 0


def daemon_in(daemon_process, workspace, base):
    """A daemon whose config, socket and state are under *base*."""
    base.mkdir(parents=True, exist_ok=True)
    return daemon_process(workspace, base=base)


def second_daemon(daemon_process, workspace, base, *, state_dir=None, other_workspace=None):
    """Another daemon with its own socket (another XDG_RUNTIME_DIR, say), on *state_dir* when given."""
    proc = daemon_in(daemon_process, other_workspace or workspace, base)
    if state_dir is not None:
        proc.config_path.write_text(proc.config_path.read_text().replace(str(proc.state_dir), str(state_dir)))
        proc.state_dir = state_dir
    return proc


def refused(proc) -> str:
    """Start *proc*, which must exit 1 on its own; what it said."""
    proc.start(wait=False)
    assert proc.proc.wait(timeout=30) == 1, proc.log()[-2000:]
    return proc.log()


def markers_in_history(workspace) -> list[str]:
    text = "\n".join(entry.get("content", "") for entry in history_entries(workspace))
    return re.findall(r"\bM-\d+ ", text)


def test_a_second_daemon_on_the_same_state_folder_names_the_first_and_exits_1(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    first = daemon_in(daemon_process, workspace, tmp_path / "first").start()
    socket_before = os.stat(first.socket).st_ino
    other, _ = make_workspace(tmp_path / "other")
    second = second_daemon(daemon_process, workspace, tmp_path / "second", state_dir=first.state_dir,
                           other_workspace=other)
    said = refused(second)
    assert f"pid {first.proc.pid}" in said and str(first.socket) in said and str(first.state_dir) in said, said
    assert not second.socket.exists()
    assert first.proc.poll() is None and os.stat(first.socket).st_ino == socket_before
    assert first.ctl_json("status")["pid"] == first.proc.pid
    write_session(sessions, "cli:a", conversation(8))
    first.wait_for(lambda: (first.session("cli:a") or {}).get("unarchived_messages") == 8)
    write_session(sessions, "cli:a", [])  # /new: archived from the spool, by the first daemon alone
    first.wait_for(lambda: len(markers_in_history(workspace)) >= 8, timeout=30)
    assert sorted(markers_in_history(workspace)) == sorted(f"M-{index} " for index in range(8))
    assert first.stop() == 0


def test_a_second_daemon_on_the_same_workspace_with_its_own_state_names_the_first_and_exits_1(tmp_path,
                                                                                              daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(6))
    first = daemon_in(daemon_process, workspace, tmp_path / "first").start()
    second = second_daemon(daemon_process, workspace, tmp_path / "second")  # its own socket and state folder
    said = refused(second)
    assert f"pid {first.proc.pid}" in said and str(first.socket) in said and f"workspace ws ({workspace})" in said
    assert first.ctl_json("status")["pid"] == first.proc.pid
    assert not (second.state_dir / "state.db").exists()  # it touched nothing before it left
    write_session(sessions, "cli:a", [])
    first.wait_for(lambda: len(markers_in_history(workspace)) >= 6, timeout=30)
    assert sorted(markers_in_history(workspace)) == sorted(f"M-{index} " for index in range(6))
    first.kill()  # a SIGKILLed holder leaves its lock file, and its flock goes with it
    second.start()
    assert second.ctl_json("status")["workspaces"][0]["held_elsewhere"] is None
    assert second.stop() == 0
