"""A burst of sessions crossing the budget at once, through a real daemon, while the control API is polled."""

from __future__ import annotations

import threading

from nanobotd.cli.client import Client, DaemonError
from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import conversation, make_workspace, write_session

SESSIONS = 30
CONCURRENCY = 2


def poll_until(stop: threading.Event, client: Client, answers: dict, errors: list) -> None:
    """GET /v1/sessions and /v1/status as fast as they answer; every error answer is kept."""
    while not stop.is_set():
        for path in ("/v1/sessions", "/v1/status"):
            try:
                client.get(path)
                answers[path] = answers.get(path, 0) + 1
            except DaemonError as error:
                errors.append(f"{path}: {error}")


def test_a_burst_of_new_sessions_is_archived_while_every_poll_of_the_sessions_list_answers(tmp_path,
                                                                                           daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    with FakeLLM(latency=0.05, default=Text("- [durable] the burst was archived")) as fake:
        proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
concurrency = {CONCURRENCY}
context_window = 6000
max_tokens = 1000

[consolidation]
flush = false
""").start()
        client = Client(proc.socket, timeout=60)
        stop = threading.Event()
        answers: dict[str, int] = {}
        errors: list[str] = []
        pollers = [threading.Thread(target=poll_until, args=(stop, client, answers, errors)) for _ in range(2)]
        for poller in pollers:
            poller.start()
        try:
            keys = [f"telegram:{700 + number}" for number in range(SESSIONS)]
            for number, key in enumerate(keys):  # every session new to the daemon, all at once
                write_session(sessions, key, conversation(60, words=20, tag=f"b{number}"))

            def drained() -> bool:
                rows = {row["key"]: row for row in client.get("/v1/sessions")["sessions"]}
                return all(key in rows and rows[key]["daemon_archived"] > 0
                           and rows[key]["unarchived_tokens"] < rows[key]["total_tokens"] for key in keys)

            proc.wait_for(drained, timeout=180, interval=0.2)
            proc.wait_for(lambda: not client.get("/v1/status")["jobs_running"], timeout=180, interval=0.2)
        finally:
            stop.set()
            for poller in pollers:
                poller.join(timeout=60)
        assert errors == [], errors[:3]
        assert answers.get("/v1/sessions", 0) > 10, answers
        assert fake.max_in_flight <= CONCURRENCY
        runs = [run for run in client.get("/v1/runs", {"kind": "consolidate", "limit": 1000, "all": "true"})["runs"]
                if run["session_key"] in keys]
        assert {run["session_key"] for run in runs} == set(keys)
        assert all(run["state"] == "finished" and run["outcome"] == "summarized" for run in runs), runs[:3]
    assert "control handler for GET" not in proc.log()
