"""A real daemon with an LLM configured: its calls run in the worker child, litellm never enters the daemon's
own process, and the worker leaves after llm.idle_exit_seconds. Read from /proc, not from the daemon's word."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.daemonproc import DaemonProcess
from tests.support.fakellm import FakeLLM, Text
from tests.support.observe import child_pids, litellm_mappings, stat_fields
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

KEY = "telegram:4242"
SUMMARY = "- [durable] Backups run nightly at 02:00."
IDLE_EXIT_SECONDS = 2  # the least a test can wait for: the worker is seen while its call is in flight (LATENCY)
LATENCY = 1.0
GONE_SECONDS = 15


def test_a_daemon_that_called_the_llm_never_maps_litellm_and_its_worker_leaves_when_idle(tmp_path):
    workspace, sessions = make_workspace(tmp_path / "ws")
    write_session(sessions, KEY, conversation(40))
    with FakeLLM(default=Text(SUMMARY), latency=LATENCY) as fake:
        llm_table = (f'\n[llm]\nmodel = "{fake.model}"\napi_base = "{fake.base_url}"\n'
                     f"idle_exit_seconds = {IDLE_EXIT_SECONDS}\n")
        daemon = DaemonProcess(tmp_path, workspace, sessions_dir=sessions, extra_config=llm_table).start()
        try:
            daemon.wait_for(lambda: daemon.session(KEY), timeout=60)
            assert daemon.ctl("consolidate", "--no-wait", KEY).returncode == 0
            daemon.wait_for(lambda: fake.requests, timeout=120)
            workers = daemon.wait_for(lambda: [child for child in child_pids(daemon.proc.pid)
                                               if litellm_mappings(child)], timeout=30)
            daemon.wait_for(lambda: any(SUMMARY in entry["content"] for entry in history_entries(workspace)),
                            timeout=60)
            mapped_after_the_call = litellm_mappings(daemon.proc.pid)

            daemon.wait_for(lambda: not any(Path(f"/proc/{worker}").exists() for worker in workers), timeout=120)
            mapped_when_idle = litellm_mappings(daemon.proc.pid)
        finally:
            daemon.stop()

    assert len(workers) == 1
    assert mapped_after_the_call == []
    assert mapped_when_idle == []


def wait_gone(pid: int, timeout: float = GONE_SECONDS) -> bool:
    """Whether *pid* is gone (exited and reaped, or a zombie nobody reaps yet) within *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = stat_fields(pid)[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_daemon_that_stops_or_dies_leaves_no_worker_behind(tmp_path, how):
    workspace, sessions = make_workspace(tmp_path / "ws")
    write_session(sessions, KEY, conversation(40))
    with FakeLLM(default=Text(SUMMARY)) as fake:
        llm_table = f'\n[llm]\nmodel = "{fake.model}"\napi_base = "{fake.base_url}"\n'  # idle exit: 300 s
        daemon = DaemonProcess(tmp_path, workspace, sessions_dir=sessions, extra_config=llm_table).start()
        try:
            daemon.wait_for(lambda: daemon.session(KEY), timeout=60)
            assert daemon.ctl("consolidate", KEY).returncode == 0
            daemon.wait_for(lambda: any(SUMMARY in entry["content"] for entry in history_entries(workspace)),
                            timeout=120)
            workers = child_pids(daemon.proc.pid)
            assert len(workers) == 1 and litellm_mappings(workers[0])
            if how == "SIGTERM":
                assert daemon.stop() == 0
            else:
                daemon.kill()
        finally:
            daemon.stop()
        gone = wait_gone(workers[0])

    assert gone, f"the LLM worker {workers[0]} outlived its daemon ({how})"
    if how == "SIGTERM":
        log = daemon.log()
        assert f"LLM worker {workers[0]} started (litellm ready in " in log
        assert f"LLM worker {workers[0]} exited (closed) after " in log
