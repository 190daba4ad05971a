"""The counting process: the same counts as the daemon's own counting, started only for big scans, let go
when idle, and never losing a count when it dies or hangs."""

from __future__ import annotations

import os
import signal
import sys
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanobotd import tokens
from nanobotd.tokenprocess import CountingProcess, ProcessCounts, counting_processes
from nanobotd.tokens import PendingCounts, count_tokens_batch
from tests.support.observe import pid_exists

ENCODING = "cl100k_base"
TEXTS = ["hello world", "Grüße aus Köln — 東京 🚀", "a lone surrogate \ud800 from json.loads", "", "x" * 20_000,
         "def f(x):\n    return x ** 2\n", "tool call {\"a\": [1, 2, 3]}"]


def started(counting: CountingProcess) -> CountingProcess:
    """Hand it enough texts to start its process, and wait for their counts."""
    counting.submit(["warm up"] * counting.after_texts, ENCODING).result()
    assert counting.running
    return counting


def test_the_process_counts_what_the_daemon_counts_even_lone_surrogates():
    counting = started(CountingProcess(after_texts=1))
    try:
        pending = counting.submit(TEXTS, ENCODING)
        assert isinstance(pending, ProcessCounts)
        assert pending.result() == count_tokens_batch(TEXTS, ENCODING)
        other = counting.submit(TEXTS[:2], "o200k_base")  # the encoding travels with the batch
        assert other.result() == count_tokens_batch(TEXTS[:2], "o200k_base")
        many = [f"text {number}" for number in range(20_000)]  # an answer (80 kB) over a pipe's 64 kB
        assert counting.submit(many, ENCODING).result() == count_tokens_batch(many, ENCODING)
        assert isinstance(counting.submit(TEXTS, ENCODING), ProcessCounts), "still counting in the process"
    finally:
        counting.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.text(max_size=300), max_size=40), min_size=1, max_size=6))
def test_batches_in_flight_are_answered_each_with_its_own_counts(batches):
    counting = _shared()
    pending = [counting.submit(texts, ENCODING) for texts in batches]  # all sent before any is read
    assert [answer.result() for answer in pending] == [count_tokens_batch(texts, ENCODING) for texts in batches]


_SHARED: list[CountingProcess] = []


def _shared() -> CountingProcess:
    if not _SHARED:
        _SHARED.append(started(CountingProcess(after_texts=1)))
    return _SHARED[0]


def teardown_module():
    for counting in _SHARED:
        counting.close()


def test_small_counts_stay_in_the_daemon_and_a_big_scan_starts_the_process():
    counting = CountingProcess(after_texts=300)
    try:
        first = counting.submit(["one text"] * 128, ENCODING)
        assert isinstance(first, PendingCounts) and not counting.running
        assert first.result() == [2] * 128
        counting.submit(["one text"] * 128, ENCODING).result()
        assert not counting.running  # 256 texts so far
        third = counting.submit(["one text"] * 128, ENCODING)
        assert isinstance(third, ProcessCounts) and counting.running
        assert third.result() == [2] * 128
        assert counting.starts == 1
    finally:
        counting.close()
    assert not counting.running


def test_an_idle_process_is_let_go_and_a_later_big_scan_starts_another():
    counting = started(CountingProcess(after_texts=10))
    pid = counting.pid
    try:
        assert counting.stop_if_idle(3600) is False
        time.sleep(0.05)
        assert counting.stop_if_idle(0.01) is True
        assert not counting.running and counting.pid is None
        assert not pid_exists(pid)
        assert isinstance(counting.submit(["a"] * 5, ENCODING), PendingCounts)  # counting starts over
        started(counting)
        assert counting.starts == 2 and counting.pid != pid
    finally:
        counting.close()


def test_the_daemon_knows_how_many_counting_processes_are_alive():
    before = counting_processes()  # other tests' shared ones
    first, second = started(CountingProcess(after_texts=1)), started(CountingProcess(after_texts=1))
    try:
        assert counting_processes() == before + 2
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while counting_processes() > before + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counting_processes() == before + 1, "a dead one is not counted"
        second.close()
        assert counting_processes() == before
    finally:
        first.close()
        second.close()


def test_a_killed_process_loses_no_count_and_the_rest_is_counted_in_the_daemon():
    counting = started(CountingProcess(after_texts=1))
    try:
        long_texts = ["word " * 4000] * 64
        pending = [counting.submit(long_texts, ENCODING) for _ in range(20)]
        os.kill(counting.pid, signal.SIGKILL)
        expected = count_tokens_batch(long_texts, ENCODING)
        assert all(answer.result() == expected for answer in pending)
        later = counting.submit(TEXTS, ENCODING)  # failed: counted in the daemon until it is let go
        assert isinstance(later, PendingCounts) and later.result() == count_tokens_batch(TEXTS, ENCODING)
    finally:
        counting.close()


def test_a_process_that_never_answers_is_killed_at_the_timeout_and_the_batch_counted_in_the_daemon():
    silent = [sys.executable, "-c", "import sys, time; sys.stdin.buffer.read(); time.sleep(60)"]
    counting = CountingProcess(silent, after_texts=1, result_timeout=0.5)
    try:
        pending = counting.submit(TEXTS, ENCODING)
        assert isinstance(pending, ProcessCounts)
        pid = counting.pid
        asked = time.monotonic()
        assert pending.result() == count_tokens_batch(TEXTS, ENCODING)
        assert time.monotonic() - asked < 30
        _wait_gone(pid)
    finally:
        counting.close()


def test_a_process_that_answers_garbage_is_let_go_and_the_batch_counted_in_the_daemon():
    garbage = [sys.executable, "-c",
               "import sys; sys.stdin.buffer.read(4); sys.stdout.buffer.write(b'\\x02\\x00\\x00\\x00abcdefgh');"
               "sys.stdout.flush()"]
    counting = CountingProcess(garbage, after_texts=1)
    try:
        pending = counting.submit(TEXTS, ENCODING)  # 7 texts asked, 2 counts answered
        assert pending.result() == count_tokens_batch(TEXTS, ENCODING)
    finally:
        counting.close()


def test_a_process_that_cannot_start_leaves_counting_to_the_daemon():
    counting = CountingProcess(["/nonexistent/counting-process"], after_texts=1)
    pending = counting.submit(TEXTS, ENCODING)
    assert isinstance(pending, PendingCounts) and pending.result() == count_tokens_batch(TEXTS, ENCODING)
    counting.close()


def test_releasing_the_encodings_does_not_touch_the_process():
    counting = started(CountingProcess(after_texts=1))
    try:
        tokens.count_tokens("warm up")
        tokens._Usage.last_used -= 7200
        tokens.release_if_idle(3600)
        assert counting.submit(TEXTS, ENCODING).result() == count_tokens_batch(TEXTS, ENCODING)
    finally:
        counting.close()


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_exists(pid)


def test_the_process_is_let_go_when_the_last_scan_using_it_is_done():
    counting = CountingProcess(after_texts=1)
    try:
        with counting.in_use():
            with counting.in_use():  # a watcher's scan during a reconcile
                assert counting.submit(["one text"] * 4, ENCODING).result() == [2] * 4
            assert counting.running  # the reconcile goes on: its process is kept
            assert counting.submit(["one text"] * 4, ENCODING).result() == [2] * 4
            pid = counting.pid
        assert not counting.running and counting.pid is None
        assert not pid_exists(pid)
        assert counting.starts == 1
    finally:
        counting.close()


def test_a_process_started_before_any_batch_loads_its_encoding_and_counts_the_first_batch_itself():
    counting = CountingProcess(after_texts=10_000)
    try:
        assert counting.start_now(ENCODING) is True
        assert counting.running and counting.starts == 1
        first = counting.submit(["one text"] * 3, ENCODING)  # far fewer than after_texts: it is running already
        assert isinstance(first, ProcessCounts) and first.result() == [2] * 3
        assert counting.start_now(ENCODING) is True and counting.starts == 1  # one process, asked again
    finally:
        counting.close()
    assert not counting.running


def test_a_process_started_early_and_never_used_is_let_go_like_any_other():
    counting = CountingProcess()
    counting.start_now(ENCODING)
    pid = counting.pid
    try:
        time.sleep(0.05)
        with counting.in_use():  # a start-up reconcile that found nothing to count
            pass
        assert not counting.running and not pid_exists(pid)
    finally:
        counting.close()
