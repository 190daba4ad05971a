"""The LLM worker process: calls run in it for real (litellm against the fake server), it leaves when idle,
and a worker that dies or stops answering is dealt with. Tests share the package's worker (conftest) where
they can, since each start imports litellm, so they count the starts they cause rather than the total."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from loguru import logger

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import LLMClient
from nanobotd.llm.embeddings import Embedder
from nanobotd.llm.failures import LLMUnavailable
from nanobotd.llm.process import LLMWorker
from tests.llm.calls import READ_FILE_TOOL, USER_TURN
from tests.support.fakellm import EMBEDDING_DIMENSIONS, FakeLLM, Hang, Text, ToolCalls, fake_embedding

LITELLM_LIBRARIES = ("/pydantic_core/", "/tokenizers/", "/aiohttp/")
WAIT_SECONDS = 60
# Stand-ins for a worker, for what the real one does not do on request: one that says it is ready and then
# never reads its stdin again, and one that writes to stderr and leaves when its stdin closes.
DEAF_WORKER = ("import json, os, sys, time; print(json.dumps({'ready': os.getpid()}), flush=True); "
               "time.sleep(3600)")
CHATTY_WORKER = ("import json, os, sys; print('warming up the model table', file=sys.stderr, flush=True); "
                 "print(json.dumps({'ready': os.getpid()}), flush=True); sys.stdin.read()")


def client_on(worker: LLMWorker, fake: FakeLLM, **overrides) -> LLMClient:
    async def no_sleep(seconds: float) -> None:
        pass

    settings = LLMSettings(model=fake.model, api_base=fake.base_url, **overrides)
    return LLMClient(settings, api_key="sk-test", sleep=no_sleep, worker=worker)


def mapped_libraries(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as handle:
        text = handle.read()
    return {library for library in LITELLM_LIBRARIES if library in text}


def wait_until(predicate, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


async def wait_for_requests(fake: FakeLLM, count: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while len(fake.requests) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"the server never saw request {count}")
        await asyncio.sleep(0.02)


def test_a_text_call_and_a_tool_call_run_in_a_worker_process_that_holds_litellm(fake, worker):
    fake.push(Text("We keep nightly backups."), ToolCalls([("read_file", {"path": "USER.md"})]))
    client = client_on(worker, fake)

    async def two_calls():
        return await client.complete(USER_TURN), await client.complete(USER_TURN, tools=[READ_FILE_TOOL])

    starts = worker.starts
    text, tool_call = asyncio.run(two_calls())

    assert text.content == "We keep nightly backups."
    assert [(call.name, call.arguments) for call in tool_call.tool_calls] == [("read_file", {"path": "USER.md"})]
    assert fake.requests[1]["tools"] == [READ_FILE_TOOL]
    assert worker.pid not in (None, os.getpid())
    assert mapped_libraries(worker.pid)
    assert worker.starts <= starts + 1


def test_the_worker_exits_after_its_idle_time_and_a_later_call_starts_a_new_one(fake):
    worker = LLMWorker(idle_exit_seconds=0.5)
    client = client_on(worker, fake)
    try:
        asyncio.run(client.complete(USER_TURN))
        first = worker.pid

        wait_until(lambda: worker.pid is None and not Path(f"/proc/{first}").exists())
        reply = asyncio.run(client.complete(USER_TURN))
    finally:
        worker.close(wait=5)

    assert reply.content == "(nothing)"
    assert worker.starts == 2


def test_a_worker_killed_mid_call_is_replaced_and_the_call_sent_once_more(fake, worker):
    client = client_on(worker, fake)
    asyncio.run(client.complete(USER_TURN))
    starts = worker.starts
    fake.push(Hang(), Text("after the restart"))

    async def kill_during_the_call():
        call = asyncio.create_task(client.complete(USER_TURN))
        await wait_for_requests(fake, 2)
        killed = worker.pid
        os.kill(killed, signal.SIGKILL)
        return killed, await call

    killed, reply = asyncio.run(kill_during_the_call())

    assert reply.content == "after the restart"
    assert reply.attempts == 1
    assert len(fake.requests) == 3
    assert worker.pid != killed
    assert worker.starts == starts + 1


def test_a_worker_killed_twice_on_one_call_makes_it_unavailable(fake, worker):
    fake.push(Hang(), Hang(), Text("never asked for"))
    client = client_on(worker, fake, max_retries=3)

    async def kill_twice():
        call = asyncio.create_task(client.complete(USER_TURN))
        for count in (1, 2):
            await wait_for_requests(fake, count)
            os.kill(worker.pid, signal.SIGKILL)
        await call

    with pytest.raises(LLMUnavailable) as raised:
        asyncio.run(kill_twice())

    assert raised.value.kind == "worker"
    assert "killed by signal 9" in str(raised.value)
    assert len(fake.requests) == 2


def test_a_worker_that_cannot_start_makes_the_call_unavailable_after_one_restart(fake):
    worker = LLMWorker(command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    client = client_on(worker, fake)

    with pytest.raises(LLMUnavailable) as raised:
        asyncio.run(client.complete(USER_TURN))

    assert raised.value.kind == "worker"
    assert "exited with status 3" in str(raised.value)
    assert worker.starts == 2
    assert fake.requests == []


def test_a_stopped_worker_is_killed_at_the_call_timeout_and_the_next_call_gets_a_new_one(fake, worker):
    asyncio.run(client_on(worker, fake).complete(USER_TURN))  # a worker's first call is slower: warm it
    client = client_on(worker, fake, timeout_seconds=2, max_retries=0)
    starts = worker.starts
    fake.push(Hang())

    async def stop_during_the_call():
        call = asyncio.create_task(client.complete(USER_TURN))
        await wait_for_requests(fake, 2)
        stopped = worker.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            await call
        finally:
            wait_until(lambda: not Path(f"/proc/{stopped}").exists())
        return stopped

    with pytest.raises(LLMUnavailable) as raised:
        asyncio.run(stop_during_the_call())

    assert raised.value.kind == "timeout"
    assert "killed" in str(raised.value)
    reply = asyncio.run(client_on(worker, fake).complete(USER_TURN))
    assert reply.content == "(nothing)"
    assert worker.starts == starts + 1


def test_a_cancelled_call_is_dropped_by_the_worker_which_keeps_serving(fake, worker):
    client = client_on(worker, fake)
    asyncio.run(client.complete(USER_TURN))
    starts = worker.starts
    fake.push(Hang())

    async def cancel_then_call_again():
        call = asyncio.create_task(client.complete(USER_TURN))
        await wait_for_requests(fake, 2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return await client.complete(USER_TURN)

    reply = asyncio.run(cancel_then_call_again())

    assert reply.content == "(nothing)"
    assert worker.starts == starts


def test_concurrent_calls_run_at_once_through_one_worker(fake, worker):
    asyncio.run(client_on(worker, fake).complete(USER_TURN))
    starts, pid = worker.starts, worker.pid
    fake.latency = 0.5
    client = client_on(worker, fake, concurrency=3)

    async def three_at_once():
        return await asyncio.gather(*(client.complete(USER_TURN) for _ in range(3)))

    replies = asyncio.run(three_at_once())

    assert [reply.content for reply in replies] == ["(nothing)"] * 3
    assert fake.max_in_flight == 3
    assert (worker.starts, worker.pid) == (starts, pid)


def test_a_worker_that_stops_reading_is_killed_at_the_call_timeout(fake):
    worker = LLMWorker(command=[sys.executable, "-c", DEAF_WORKER])
    client = client_on(worker, fake, timeout_seconds=1, max_retries=0)
    big_turn = [{"role": "user", "content": "x" * 1_000_000}]  # more than a pipe holds: the write blocks

    async def call_and_note_the_worker():
        call = asyncio.create_task(client.complete(big_turn))
        while worker.pid is None:
            await asyncio.sleep(0.01)
        deaf = worker.pid
        try:
            await call
        finally:
            wait_until(lambda: not Path(f"/proc/{deaf}").exists())

    started = time.monotonic()
    with pytest.raises(LLMUnavailable) as raised:
        asyncio.run(call_and_note_the_worker())

    assert raised.value.kind == "timeout"
    assert "did not answer within 1s; killed" in str(raised.value)
    assert time.monotonic() - started < 15
    assert worker.pid is None
    assert fake.requests == []


def test_the_workers_stderr_start_and_exit_reach_the_daemon_log():
    worker = LLMWorker(command=[sys.executable, "-c", CHATTY_WORKER])
    lines: list[str] = []
    handler_id = logger.add(lambda line: lines.append(line.rstrip()), level="DEBUG", format="{level} {message}")
    try:
        asyncio.run(worker.start())
        pid = worker.pid
        worker.close(wait=10)
        wait_until(lambda: any("exited" in line for line in lines) and any("warming" in line for line in lines))
    finally:
        logger.remove(handler_id)

    own = [line for line in lines if f"LLM worker {pid}" in line]  # stderr and stdout are read apart: any order
    assert f"WARNING LLM worker {pid}: warming up the model table" in own
    assert sum(line.startswith(f"INFO LLM worker {pid} started (litellm ready in ") for line in own) == 1
    assert sum(line.startswith(f"INFO LLM worker {pid} exited (closed) after ") for line in own) == 1
    assert len(own) == 3


def test_embeddings_run_in_the_worker_too(fake, worker):
    embedder = Embedder("openai/fake-embed", LLMSettings(model="none", api_base=fake.base_url), worker=worker)

    vectors = embedder.embed(["the cat is called Luna", "backups run nightly"])

    assert vectors == [fake_embedding("the cat is called Luna", EMBEDDING_DIMENSIONS),
                       fake_embedding("backups run nightly", EMBEDDING_DIMENSIONS)]
    assert fake.requests[0]["input"] == ["the cat is called Luna", "backups run nightly"]
    assert worker.pid not in (None, os.getpid())


def test_a_client_without_a_worker_starts_its_own_and_closing_the_client_ends_it(fake):
    settings = LLMSettings(model=fake.model, api_base=fake.base_url, idle_exit_seconds=123)
    client = LLMClient(settings, api_key="sk-a")
    given = LLMClient(settings, api_key="sk-b", worker=client.worker)

    async def call_then_close():
        await asyncio.gather(client.complete(USER_TURN), given.complete(USER_TURN))
        pid = client.worker.pid
        await given.aclose()  # a worker given belongs to whoever made it
        reply = await client.complete(USER_TURN)
        assert client.worker.pid == pid
        await client.aclose()
        return pid, reply

    pid, reply = asyncio.run(call_then_close())
    assert reply.content == "(nothing)"
    assert client.worker.starts == 1 and client.worker.idle_exit_seconds == 123
    wait_until(lambda: not Path(f"/proc/{pid}").exists())
    assert client.worker.pid is None
