"""The job queue: coalescing, one job per session, bounded LLM concurrency, no double dream."""

from __future__ import annotations

import asyncio

from nanobotd.config.schema import LLMSettings
from nanobotd.daemon.jobqueue import JOBS_PER_LLM_SLOT, JobQueue
from nanobotd.llm.client import LLMClient
from nanobotd.state.store import StateStore
from tests.support.fakellm import FakeLLM, Responder, Text
from tests.support.llmworker import shared_worker


def test_llm_concurrency_is_bounded_and_every_job_runs(tmp_path):
    store = StateStore(tmp_path).open()

    async def scenario():
        queue = JobQueue(store, llm_concurrency=2)
        order, running = [], {"now": 0, "most": 0}

        def body(name):
            async def run(run_id):
                running["now"] += 1
                running["most"] = max(running["most"], running["now"])
                await asyncio.sleep(0.05)
                running["now"] -= 1
                order.append(name)
                store.finish_run(run_id, state="finished", outcome="ok")
            return run

        ids = [queue.submit("consolidate", "ws", f"session:{n}", body(n)) for n in range(8)]
        await queue.wait_idle()
        return ids, order, running["most"]

    ids, order, most_running = asyncio.run(scenario())
    assert most_running == 2 * JOBS_PER_LLM_SLOT
    assert sorted(order) == list(range(8)) and len(set(ids)) == 8
    assert all(store.get_run(run_id).state == "finished" for run_id in ids)


LOCAL_WORK_SECONDS = 0.5


def test_llm_requests_share_the_queue_slots_across_clients_and_jobs_overlap_their_local_work(tmp_path):
    """Two workspaces' clients, six LLM jobs each doing local work after every request: never more requests at
    the server than llm.concurrency, and requests are answered while other jobs do their local work."""
    store = StateStore(tmp_path).open()
    local = {"now": 0, "requests_during_local_work": 0, "jobs": 0, "most_jobs": 0}

    def answer(request):
        local["requests_during_local_work"] += local["now"] > 0
        return Text("- [durable] fact")

    async def scenario(fake):
        queue = JobQueue(store, llm_concurrency=2)
        settings = LLMSettings(model=fake.model, api_base=fake.base_url, concurrency=2)
        clients = [LLMClient(settings, worker=worker), LLMClient(settings, worker=worker)]  # the daemon's one worker
        for client in clients:
            client.share_slots(queue.llm_slots)

        def body(client):
            async def run(run_id):
                local["jobs"] += 1
                local["most_jobs"] = max(local["most_jobs"], local["jobs"])
                for _ in range(2):
                    await client.complete([{"role": "user", "content": "archive this"}])
                    local["now"] += 1  # the journal and history append between requests (long enough that a
                    await asyncio.sleep(LOCAL_WORK_SECONDS)  # loaded machine still starts the next request in it)
                    local["now"] -= 1
                local["jobs"] -= 1
                store.finish_run(run_id, state="finished", outcome="ok")
            return run

        ids = [queue.submit("consolidate", "ws", f"session:{n}", body(clients[n % 2])) for n in range(6)]
        await queue.wait_idle()
        return ids

    worker = shared_worker()  # the test process's one worker child: litellm imported once
    with FakeLLM(latency=0.2, default=Responder(answer)) as fake:
        ids = asyncio.run(scenario(fake))
        assert len(fake.requests) == 12
        assert fake.max_in_flight == 2, "llm.concurrency bounds requests daemon-wide, over both clients"
    assert all(store.get_run(run_id).state == "finished" for run_id in ids)
    assert local["most_jobs"] == 2 * JOBS_PER_LLM_SLOT
    assert local["requests_during_local_work"] > 0, "no request was answered while another job did local work"


def test_a_second_submit_for_a_queued_target_is_coalesced_and_a_running_dream_is_joined(tmp_path):
    store = StateStore(tmp_path).open()

    async def scenario():
        queue = JobQueue(store, llm_concurrency=1)
        started = asyncio.Event()
        release = asyncio.Event()
        runs = []

        async def slow(run_id):
            runs.append(run_id)
            started.set()
            await release.wait()
            store.finish_run(run_id, state="finished", outcome="ok")

        first = queue.submit("dream", "ws", "dream", slow, join_running=True)
        await started.wait()
        second = queue.submit("dream", "ws", "dream", slow, join_running=True)
        a = queue.submit("consolidate", "ws", "session:x", slow)
        b = queue.submit("consolidate", "ws", "session:x", slow)
        release.set()
        await queue.wait_idle()
        return first, second, a, b, runs

    first, second, a, b, runs = asyncio.run(scenario())
    assert first == second, "a running dream is joined, not started twice"
    assert a == b, "a queued job for the same session is coalesced"
    assert runs.count(first) == 1 and runs.count(a) == 1


def test_a_failing_job_is_recorded_and_the_queue_goes_on(tmp_path):
    store = StateStore(tmp_path).open()

    async def scenario():
        queue = JobQueue(store)

        async def broken(run_id):
            raise ValueError("bug")

        async def fine(run_id):
            store.finish_run(run_id, state="finished", outcome="ok")

        bad = queue.submit("flush", "ws", "session:a", broken)
        good = queue.submit("flush", "ws", "session:b", fine)
        await queue.wait_idle()
        return bad, good

    bad, good = asyncio.run(scenario())
    assert store.get_run(bad).state == "failed" and "bug" in store.get_run(bad).manifest["error"]
    assert store.get_run(good).state == "finished"


def test_a_wider_job_does_not_join_a_narrower_queued_one_but_queues_behind_it(tmp_path):
    store = StateStore(tmp_path).open()

    async def scenario():
        queue = JobQueue(store, llm_concurrency=1)
        release = asyncio.Event()
        done = []

        def body(name):
            async def run(run_id):
                await release.wait()
                done.append(name)
                store.finish_run(run_id, state="finished", outcome="ok")
            return run

        running = queue.submit("consolidate", "ws", "session:x", body("running"), scope=0)
        await asyncio.sleep(0.01)
        budget = queue.submit("consolidate", "ws", "session:x", body("budget"), scope=0)
        manual = queue.submit("consolidate", "ws", "session:x", body("manual"), scope=1)
        phases = (queue.phase(running), queue.phase(budget), queue.phase(manual))
        later_budget = queue.submit("consolidate", "ws", "session:x", body("later"), scope=0)
        release.set()
        await queue.wait_idle()
        return running, budget, manual, later_budget, phases, done

    running, budget, manual, later_budget, phases, done = asyncio.run(scenario())
    assert len({running, budget, manual}) == 3, "the manual run is its own, not the queued budget one"
    assert later_budget == manual, "a narrower trigger joins the wider queued run"
    assert phases == ("running", "queued", "queued")
    assert done == ["running", "budget", "manual"]


def test_every_run_that_ends_gets_one_info_line_in_the_log(tmp_path):
    from loguru import logger

    store = StateStore(tmp_path).open()
    lines = []
    sink = logger.add(lambda message: lines.append(message.record), level="INFO")

    async def scenario():
        queue = JobQueue(store)

        async def body(run_id):
            store.finish_run(run_id, state="finished", outcome="raw_fallback",
                             manifest={"chunks": [{"done": True, "count": 4}], "cursors": [7]})

        run_id = queue.submit("consolidate", "ws", "session:x", body, session_key="cli:a")
        await queue.wait_idle()
        return run_id

    try:
        run_id = asyncio.run(scenario())
    finally:
        logger.remove(sink)
    ends = [record for record in lines if record["message"].startswith(f"run {run_id}")]
    assert len(ends) == 1 and ends[0]["level"].name == "INFO"
    assert ends[0]["message"].startswith(f"run {run_id} (consolidate, workspace ws session cli:a) finished: "
                                         "raw_fallback in ")
    assert ends[0]["message"].endswith("history entries added: 1, messages archived: 4, "
                                       "files: memory/history.jsonl")


def test_wait_ended_returns_when_the_run_ends_or_its_time_is_up(tmp_path):
    """A waiting nanobotctl's GET /v1/runs/{id}?wait_ms= rests on wait_ended: it returns with the run's end,
    not at the end of its time; after its time while the run goes on; at once for a run the queue does not
    hold."""
    store = StateStore(tmp_path).open()

    async def scenario():
        queue = JobQueue(store, llm_concurrency=1)
        release = asyncio.Event()

        async def body(run_id):
            await release.wait()
            store.finish_run(run_id, state="finished", outcome="ok")

        run_id = queue.submit("consolidate", "ws", "session:a", body, uses_llm=False)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await queue.wait_ended(run_id, 0.2)  # still running: its time is up
        timed_out = (loop.time() - started, store.get_run(run_id).state)
        loop.call_later(0.1, release.set)
        started = loop.time()
        await queue.wait_ended(run_id, 30.0)
        ended = (loop.time() - started, store.get_run(run_id).state)
        started = loop.time()
        await queue.wait_ended(run_id, 30.0)  # ended: no longer the queue's
        await queue.wait_ended("no-such-run", 30.0)
        return timed_out, ended, loop.time() - started

    timed_out, ended, unheld = asyncio.run(scenario())
    assert timed_out[0] >= 0.2 and timed_out[1] == "started"
    assert ended[1] == "finished" and 0.1 <= ended[0] < 5.0
    assert unheld < 1.0
    store.close()
