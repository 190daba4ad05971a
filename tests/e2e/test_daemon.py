"""A real daemon subprocess on a tmp workspace, observed through nanobotctl."""

from __future__ import annotations

import shutil
import socket
import time

import pytest

from tests.support.workspace import conversation, make_workspace, write_session


@pytest.fixture
def daemon(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    proc = daemon_process(workspace)
    proc.workspace, proc.sessions = workspace, sessions
    yield proc
    proc.kill()


def test_sessions_appear_grow_get_cleared_and_corrupted_while_it_runs(daemon):
    daemon.start()
    write_session(daemon.sessions, "cli:a", conversation(4))
    first = daemon.wait_for(lambda: daemon.session("cli:a"))
    assert first["unarchived_messages"] == 4
    write_session(daemon.sessions, "cli:a", conversation(10))
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 10)
    write_session(daemon.sessions, "cli:a", conversation(10), extra_lines=["{corrupt", "\x00\x01garbage"])
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("corrupt_lines") == 2)
    write_session(daemon.sessions, "cli:a", [])
    # /new: the ten spooled messages vanished from the file and are rescued into history (offline: raw)
    daemon.wait_for(lambda: (daemon.workspace / "memory" / "history.jsonl").exists())
    rescued = daemon.wait_for(lambda: [run for run in daemon.ctl_json("runs")["runs"]
                                       if run["state"] == "finished" and run["kind"] == "consolidate"])
    assert rescued
    history_text = (daemon.workspace / "memory" / "history.jsonl").read_text()
    for index in range(10):
        assert f"M-{index} " in history_text
    status = daemon.ctl_json("status")
    assert status["workspaces"][0]["sessions_watched"] == 1
    assert status["workspaces"][0]["llm_mode"] == "offline"
    assert daemon.stop() == 0


def test_reconcile_catches_changes_made_while_the_folder_was_deleted_and_recreated(daemon):
    daemon.start()
    write_session(daemon.sessions, "cli:a", conversation(2))
    daemon.wait_for(lambda: daemon.session("cli:a"))
    shutil.rmtree(daemon.sessions)
    daemon.sessions.mkdir(parents=True)
    (daemon.sessions / ".workspace").write_text(str(daemon.workspace))
    write_session(daemon.sessions, "cli:b", conversation(6))
    found = daemon.wait_for(lambda: daemon.session("cli:b"), timeout=20)
    assert found["unarchived_messages"] == 6
    write_session(daemon.sessions, "cli:b", conversation(8))
    daemon.wait_for(lambda: (daemon.session("cli:b") or {}).get("unarchived_messages") == 8, timeout=5)


def test_events_missed_while_not_running_are_caught_at_start(daemon):
    write_session(daemon.sessions, "cli:a", conversation(6))
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:a"))
    daemon.stop()
    write_session(daemon.sessions, "cli:a", conversation(12))
    write_session(daemon.sessions, "cli:b", conversation(2))
    daemon.start()
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 12)
    # the start-up reconcile says what it read, and how long it took (an operator's cold start figure)
    assert daemon.wait_for(lambda: "start-up reconcile of 2 session file(s) done in" in daemon.log()
                           and "(2 changed)" in daemon.log())


def test_a_workspace_that_does_not_exist_yet_is_waited_for(tmp_path, daemon_process):
    workspace = tmp_path / "later"
    proc = daemon_process(workspace)
    try:
        proc.start()
        assert proc.ctl_json("status")["workspaces"][0]["exists"] is False
        _, sessions = make_workspace(tmp_path / "x")
        shutil.move(str(tmp_path / "x" / "workspace"), str(workspace))
        write_session(workspace / "sessions", "cli:z", conversation(2))
        proc.wait_for(lambda: proc.session("cli:z"), timeout=20)
    finally:
        proc.kill()


def test_a_second_daemon_on_the_same_socket_exits_with_a_clear_error(daemon, tmp_path, daemon_process):
    daemon.start()
    (tmp_path / "second").mkdir()
    second = daemon_process(daemon.workspace, base=tmp_path / "second")
    second.socket = daemon.socket
    second.config_path.write_text(daemon.config_path.read_text().replace(str(daemon.state_dir),
                                                                          str(tmp_path / "second" / "state")))
    second.start(wait=False)
    assert second.proc.wait(timeout=30) != 0
    assert "already" in second.log()
    assert daemon.ctl("status").returncode == 0


class NotifySocket:
    """A systemd notify socket in *folder*: the datagrams a daemon sends to it, waited for by their content."""

    def __init__(self, folder) -> None:
        self.address = str(folder / "notify.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.listener.bind(self.address)
        self.listener.settimeout(0.5)
        self.messages: list[str] = []

    def wait(self, until: str, since: int = 0, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not any(until in message for message in self.messages[since:]):
            if time.monotonic() > deadline:
                raise AssertionError(f"{until} not received; got {self.messages}")
            try:
                self.messages.append(self.listener.recv(4096).decode("ascii"))
            except TimeoutError:
                continue


def test_notify_socket_receives_ready_watchdog_status_reloading_stopping_in_order(tmp_path, daemon_process):
    workspace, _ = make_workspace(tmp_path)
    notify = NotifySocket(tmp_path)
    proc = daemon_process(workspace, env={"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "1000000"})
    try:
        proc.start()
        notify.wait("READY=1")
        notify.wait("WATCHDOG=1")
        proc.proc.send_signal(1)
        notify.wait("RELOADING=1")
        notify.wait("WATCHDOG=1", since=len(notify.messages))
        assert "config reloaded" in proc.log()
        proc.proc.send_signal(15)
        notify.wait("STOPPING=1")
        assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        notify.listener.close()
    kinds = [next((name for name in ("READY=1", "WATCHDOG=1", "RELOADING=1", "STOPPING=1") if name in m), "STATUS")
             for m in notify.messages]
    order = [kind for kind in kinds if kind != "STATUS"]
    assert order.index("READY=1") < order.index("WATCHDOG=1") < order.index("RELOADING=1") < order.index("STOPPING=1")
    assert any(message.startswith("STATUS=") and message.isascii() for message in notify.messages)


def test_a_reload_that_fails_on_the_way_still_tells_systemd_it_is_ready(tmp_path, daemon_process):
    workspace, _ = make_workspace(tmp_path)
    notify = NotifySocket(tmp_path)
    proc = daemon_process(workspace, env={"NOTIFY_SOCKET": notify.address,
                                          "NANOBOTD_FAULTS": "daemon.reloading=enospc"})
    try:
        proc.start()
        notify.wait("READY=1")
        proc.proc.send_signal(1)
        notify.wait("RELOADING=1")
        notify.wait("READY=1", since=len(notify.messages))
        proc.wait_for(lambda: "fault point daemon.reloading" in proc.log())
        assert "config reloaded" not in proc.log()
        assert proc.ctl("status").returncode == 0
    finally:
        proc.kill()
        notify.listener.close()


def test_the_polling_observer_tracks_changes_too(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    proc = daemon_process(workspace, args=("--polling",))
    try:
        proc.start()
        write_session(sessions, "cli:p", conversation(3))
        proc.wait_for(lambda: proc.session("cli:p"), timeout=15)
        write_session(sessions, "cli:p", conversation(5))
        proc.wait_for(lambda: (proc.session("cli:p") or {}).get("unarchived_messages") == 5, timeout=15)
        assert proc.ctl_json("status")["workspaces"][0]["watcher"]["mode"] == "polling"
    finally:
        proc.kill()
