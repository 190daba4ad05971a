"""nanobotd/daemon/handlers/sessions.py: GET /v1/runs/{id} on a real socket, with a real job queue and ledger."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nanobotd.api.router import Router
from nanobotd.api.server import ControlServer
from nanobotd.cli.client import Client, DaemonError
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers import sessions
from nanobotd.daemon.jobqueue import JobQueue
from nanobotd.state.store import StateStore
from tests.cli.fakedaemon import ServerThread


@pytest.fixture
def daemon(tmp_path: Path):
    """The run endpoints behind a real control server, whose loop runs a real job queue over a real ledger;
    yields (socket path, the server thread, the queue, the store)."""
    base = Path(tempfile.mkdtemp(prefix="nbr-", dir="/tmp"))
    socket_path = base / "run" / "nanobotd.sock"
    store = StateStore(tmp_path / "state").open()
    try:
        with ThreadPoolExecutor(1) as executor:
            core = Core(config=None, store=store, executor=executor, scheduler=None)
            router = Router()
            for method, pattern, handler in sessions.routes(core):
                router.add(method, pattern, handler)
            with ServerThread(ControlServer(socket_path, router)) as server:
                core.queue = asyncio.run_coroutine_threadsafe(_make_queue(store), server.loop).result(10)
                yield socket_path, server, core.queue, store
    finally:
        store.close()
        shutil.rmtree(base, ignore_errors=True)


async def _make_queue(store: StateStore) -> JobQueue:
    return JobQueue(store, llm_concurrency=1)


def start_run(server: ServerThread, queue: JobQueue, store: StateStore, release: threading.Event) -> str:
    """A consolidate run on the server's loop that ends once *release* is set."""

    async def body(run_id: str) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)
        store.finish_run(run_id, state="finished", outcome="no_change")

    async def submit() -> str:
        return queue.submit("consolidate", "ws", "session:a", body, session_key="cli:a", uses_llm=False)

    return asyncio.run_coroutine_threadsafe(submit(), server.loop).result(10)


def test_an_answer_with_wait_ms_comes_as_the_run_ends_not_when_its_time_is_up(daemon) -> None:
    socket_path, server, queue, store = daemon
    release = threading.Event()
    run_id = start_run(server, queue, store, release)
    client = Client(socket_path, timeout=30)
    asked = time.monotonic()
    answer = client.get(f"/v1/runs/{run_id}", {"wait_ms": 300})
    assert answer["run"]["state"] == "started" and time.monotonic() - asked >= 0.3
    threading.Timer(0.2, release.set).start()
    asked = time.monotonic()
    answer = client.get(f"/v1/runs/{run_id}", {"wait_ms": 10_000})
    assert answer["run"]["state"] == "finished" and time.monotonic() - asked < 5.0
    asked = time.monotonic()  # an ended run is answered at once, whatever the wait asked
    assert client.get(f"/v1/runs/{run_id}", {"wait_ms": 10_000})["run"]["state"] == "finished"
    assert time.monotonic() - asked < 5.0


@pytest.mark.parametrize("value", ["-1", "10001", "soon"])
def test_a_wait_out_of_range_is_refused(daemon, value: str) -> None:
    socket_path, server, queue, store = daemon
    run_id = start_run(server, queue, store, threading.Event())
    with pytest.raises(DaemonError) as refused:
        Client(socket_path, timeout=10).get(f"/v1/runs/{run_id}", {"wait_ms": value})
    assert refused.value.status == 400 and "wait_ms" in refused.value.message


def test_a_waiting_request_hears_of_the_end_as_it_happens(daemon) -> None:
    """A request that waits a second for a run's end (wait_ms, as nanobotctl asks) is answered as the run ends,
    not when its wait is over."""
    socket_path, server, queue, store = daemon
    release = threading.Event()
    run_id = start_run(server, queue, store, release)
    ended_at: list[float] = []

    def end() -> None:
        release.set()
        ended_at.append(time.monotonic())

    threading.Timer(0.3, end).start()
    answer = Client(socket_path, timeout=30).get(f"/v1/runs/{run_id}", {"wait_ms": 1000})
    heard = time.monotonic()
    assert answer["run"]["state"] == "finished"
    assert heard - ended_at[0] < 0.5


def test_other_requests_are_answered_while_one_waits(daemon) -> None:
    socket_path, server, queue, store = daemon
    release = threading.Event()
    run_id = start_run(server, queue, store, release)
    with ThreadPoolExecutor(1) as pool:
        waiting_answer = pool.submit(Client(socket_path, timeout=30).get, f"/v1/runs/{run_id}", {"wait_ms": 10_000})
        time.sleep(0.2)
        asked = time.monotonic()
        listed = Client(socket_path, timeout=30).get("/v1/runs")
        answered_in = time.monotonic() - asked
        assert not waiting_answer.done()
        release.set()
        assert waiting_answer.result(10)["run"]["state"] == "finished"
    assert run_id in [run["run_id"] for run in listed["runs"]] and answered_in < 2.0
