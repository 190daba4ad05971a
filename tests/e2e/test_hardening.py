"""A real daemon against hostile files: FIFOs, a symlink to /dev/zero, a 9 MiB line, a symlink escape, a torn
history line, 3,000 sessions scanned while the API is asked, unknown workspaces and control characters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nanobotd.cli.client import Client, DaemonError
from nanobotd.sessions.file import filename_for_key
from tests.support.daemonproc import CTL, FIRST_LLM_CALL_SECONDS, REPO
from tests.support.observe import cpu_seconds
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

JOB_STOP_SECONDS = 3


@pytest.fixture
def daemon(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    proc = daemon_process(workspace, extra_config=f"job_stop_seconds = {JOB_STOP_SECONDS}")
    proc.workspace, proc.sessions = workspace, sessions
    return proc


def stop_within(daemon, seconds: float) -> float:
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    returncode = daemon.proc.wait(timeout=seconds + 30)
    elapsed = time.monotonic() - started
    assert returncode == 0, daemon.log()[-2000:]
    assert elapsed <= seconds, f"took {elapsed:.1f}s to stop"
    return elapsed


def test_a_fifo_named_like_a_session_file_stalls_neither_the_api_nor_sigterm(daemon):
    fifo = daemon.sessions / filename_for_key("cli:fifo")
    os.mkfifo(fifo)
    daemon.start()
    daemon.wait_reconciled()  # the folder is watched: the poke's event names the FIFO
    write_session(daemon.sessions, "cli:a", conversation(4))
    poke(fifo)
    daemon.wait_for(lambda: daemon.session("cli:a"))
    daemon.wait_for(lambda: "not a regular file (FIFO)" in daemon.log())
    for _ in range(5):
        started = time.monotonic()
        assert daemon.ctl("status", timeout=10).returncode == 0
        assert time.monotonic() - started < 5
    assert daemon.session("cli:fifo") is None
    stop_within(daemon, JOB_STOP_SECONDS + 2)
    assert fifo.exists()


def test_a_symlink_to_dev_zero_is_refused_without_spinning_and_tracking_goes_on(daemon):
    link = daemon.sessions / filename_for_key("cli:zero")
    link.symlink_to("/dev/zero")
    daemon.start()
    daemon.wait_reconciled()
    link.touch()  # touches /dev/zero's times through the link: harmless, but events name the link
    write_session(daemon.sessions, "cli:a", conversation(4))
    daemon.wait_for(lambda: daemon.session("cli:a"))
    before = cpu_seconds(daemon.proc.pid)[0]
    time.sleep(3)
    write_session(daemon.sessions, "cli:a", conversation(6))
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("messages") == 6)
    assert cpu_seconds(daemon.proc.pid)[0] - before < 2.0
    assert daemon.session("cli:zero") is None
    assert daemon.proc.poll() is None


def test_a_nine_mib_line_is_archived_in_raw_parts_and_counted(daemon):
    huge = "".join(f"paste-line-{index:07d};" for index in range(9 * 1024 * 1024 // 19 + 1))
    assert len(huge) > 9 * 1024 * 1024
    messages = conversation(2) + [{"role": "user", "content": huge, "timestamp": "2026-11-01T09:30:00"}]
    write_session(daemon.sessions, "cli:paste", messages)
    daemon.start()
    daemon.wait_for(lambda: (daemon.session("cli:paste") or {}).get("messages") == 3, timeout=60)
    assert daemon.ctl("consolidate", "cli:paste", "--wait", timeout=120).returncode == 0
    status = daemon.ctl_json("status")["workspaces"][0]  # counted once read (a long new file is held unread)
    assert status["large_messages"] == 1 and status["corrupt_lines"] == 0
    daemon.wait_for(lambda: (daemon.session("cli:paste") or {}).get("unarchived_messages") == 0, timeout=60)
    entries = history_entries(daemon.workspace)
    assert len(entries) > 500 and all(entry["content"].startswith("[RAW]") for entry in entries)
    pieces = [line.split(" ", 2)[2] for entry in entries for line in entry["content"].splitlines()
              if line.startswith("(part ")]
    assert "".join(pieces) == "[2026-11-01T09:30] USER: " + huge  # every byte, in order


def test_consolidation_refuses_a_history_symlinked_outside_and_keeps_the_messages(daemon, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text("not yours\n")
    (daemon.workspace / "memory" / "history.jsonl").symlink_to(outside)
    write_session(daemon.sessions, "cli:a", conversation(6))
    daemon.start()
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 6)
    daemon.ctl("consolidate", "cli:a", "--wait", timeout=60)
    runs = daemon.wait_for(lambda: [run for run in daemon.ctl_json("runs")["runs"]
                                    if run["kind"] == "consolidate" and run["state"] == "failed"])
    assert "UnsafePath" in json.dumps(daemon.ctl_json("run", runs[0]["run_id"]))
    assert outside.read_text() == "not yours\n"
    assert daemon.session("cli:a")["unarchived_messages"] == 6
    assert "refusing to write" in daemon.log()


def test_a_torn_history_line_found_at_start_moves_to_a_torn_file_and_is_counted(daemon):
    history = daemon.workspace / "memory" / "history.jsonl"
    whole = json.dumps({"cursor": 1, "timestamp": "2026-11-01 09:00", "content": "kept"}) + "\n"
    history.write_text(whole + '{"cursor": 2, "timestamp": "2026-11-01 09:0')
    daemon.start()
    torn = daemon.workspace / "memory" / "history.jsonl.torn"
    daemon.wait_for(torn.exists)
    assert history.read_text() == whole
    assert torn.read_text() == '{"cursor": 2, "timestamp": "2026-11-01 09:0\n'
    assert daemon.ctl_json("status")["workspaces"][0]["torn_lines"] == 1
    audit = daemon.ctl_json("audit")
    assert "bad line" not in json.dumps(audit).lower() or "torn" not in json.dumps(audit).lower()


def test_sessions_and_status_answer_consistently_while_three_thousand_files_are_scanned(daemon):
    for index in range(3000):
        write_session(daemon.sessions, f"cli:{index}", conversation(2, tag=f"s{index}"))
    daemon.start(wait=False)
    client = Client(daemon.socket, timeout=30)
    answers, failures = [], []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            sessions = client.get("/v1/sessions")
            client.get("/v1/status")
        except DaemonError as exc:
            failures.append(str(exc))
            continue
        except Exception:  # not listening yet
            time.sleep(0.05)
            continue
        answers.append(len(sessions["sessions"]))
        if not sessions["scanning"] and answers[-1] == 3000:
            break
    assert failures == []
    # the last answer has them all, and at least one came while the scan was still going (a scan of 3,000 small
    # files can be over in a few answers)
    assert answers[-1] == 3000 and len(answers) >= 2 and min(answers) < 3000
    assert answers == sorted(answers)  # each answer a snapshot: never fewer sessions than before


ENDPOINTS = [
    ("GET", "/v1/status", None), ("GET", "/v1/sessions", None), ("GET", "/v1/sessions/cli:a", None),
    ("GET", "/v1/runs", None), ("GET", "/v1/audit", None), ("GET", "/v1/metrics", None),
    ("GET", "/v1/search", {"q": "tea"}), ("GET", "/v1/context", None), ("GET", "/v1/recall", {"from": "2026-11-01"}),
    ("GET", "/v1/dream-log", None), ("POST", "/v1/consolidate", {"session": "cli:a"}),
    ("POST", "/v1/flush", {"session": "cli:a"}), ("POST", "/v1/dream", {}), ("POST", "/v1/lifecycle", {}),
    ("POST", "/v1/reindex", {}), ("POST", "/v1/restore", {"target": "HEAD~1"}),
]


def test_an_unknown_workspace_is_a_404_on_every_endpoint_and_exit_1_in_nanobotctl(daemon):
    write_session(daemon.sessions, "cli:a", conversation(2))
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:a"))
    client = Client(daemon.socket, timeout=30, workspace="nope")
    for method, path, params in ENDPOINTS:
        with pytest.raises(DaemonError) as refused:
            client.get(path, params) if method == "GET" else client.post(path, params)
        assert refused.value.status == 404, (method, path, refused.value)
    for command in (["sessions"], ["runs"], ["status"], ["search", "tea"], ["lifecycle"]):
        proc = daemon.ctl("--workspace", "nope", *command)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        assert "nope" in proc.stderr


def test_control_characters_in_a_session_key_reach_the_terminal_escaped(daemon):
    key = "cli:\x1b[2J\x1b]0;owned\x07"
    write_session(daemon.sessions, key, conversation(2))
    daemon.start()
    daemon.wait_for(lambda: daemon.ctl_json("sessions")["sessions"])
    proc = subprocess.run([sys.executable, "-c", CTL, "--socket", str(daemon.socket), "sessions"],
                          capture_output=True, timeout=30, cwd=REPO)
    assert proc.returncode == 0
    assert b"\x1b" not in proc.stdout and b"\x07" not in proc.stdout
    assert b"cli:\\x1b[2J\\x1b]0;owned\\x07" in proc.stdout


def test_sigterm_during_a_stuck_llm_call_exits_within_job_stop_seconds(tmp_path, daemon_process):
    from tests.support.fakellm import FakeLLM, Hang

    workspace, sessions = make_workspace(tmp_path)
    with FakeLLM(default=Hang(3600)) as fake:
        proc = daemon_process(workspace, extra_config=f"job_stop_seconds = {JOB_STOP_SECONDS}\n\n[llm]\n"
                              f'model = "{fake.model}"\napi_base = "{fake.base_url}"\ntimeout_seconds = 600\n'
                              "max_retries = 0\n", env={"OPENAI_API_KEY": "sk-test"})
        write_session(sessions, "cli:a", conversation(6))
        proc.start()
        proc.wait_for(lambda: proc.session("cli:a"))
        assert proc.ctl("consolidate", "--no-wait", "cli:a").returncode == 0
        proc.wait_for(lambda: fake.requests, timeout=FIRST_LLM_CALL_SECONDS)
        proc.sessions = sessions
        elapsed = stop_within(proc, JOB_STOP_SECONDS + 3)
    assert elapsed >= 0
    assert "stopped" in proc.log()


def test_sigterm_with_a_read_stuck_on_a_fifo_exits_within_job_stop_seconds(daemon):
    """A writer holds the FIFO open and never writes: a blocking read would hang the executor forever."""
    fifo = daemon.sessions / filename_for_key("cli:stuck")
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: _hold_open(fifo), daemon=True)
    writer.start()
    daemon.start()
    daemon.wait_reconciled()
    poke(fifo)
    daemon.wait_for(lambda: "not a regular file (FIFO)" in daemon.log())  # it reached the FIFO, and read no further
    assert daemon.ctl("status", timeout=10).returncode == 0
    stop_within(daemon, JOB_STOP_SECONDS + 2)


def poke(fifo: Path) -> None:
    """Write into a FIFO without waiting for a reader (O_RDWR), so the watcher sees a change naming it."""
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, b'{"role": "user", "content": "from the pipe"}\n')
    finally:
        os.close(fd)


def _hold_open(fifo: Path) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY)
    except OSError:
        return
    time.sleep(60)
    os.close(fd)
