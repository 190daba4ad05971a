"""How an LLM call fails, through litellm for real (in the worker process) against an OpenAI-compatible
server on 127.0.0.1: retries and backoff, timeouts, refused connections, bad bodies, secrets kept out."""

from __future__ import annotations

import json
import time

import pytest
from loguru import logger

from nanobotd.llm.failures import LLMBadResponse, LLMUnavailable
from tests.llm.calls import API_KEY, READ_FILE_TOOL, complete
from tests.support.fakellm import FakeLLM, Garbage, Hang, HttpError, Text, ToolCalls


def test_a_server_error_followed_by_success_is_retried_once(fake, sleeps, make_client):
    fake.push(HttpError(500), Text("fine now"))

    reply = complete(make_client(fake, sleeps))

    assert reply.content == "fine now"
    assert reply.attempts == 2
    assert len(fake.requests) == 2
    assert len(sleeps) == 1


def test_a_rate_limit_is_retried_and_its_retry_after_is_honoured(fake, sleeps, make_client):
    fake.push(HttpError(429, headers={"Retry-After": "3"}), Text("after the pause"))

    reply = complete(make_client(fake, sleeps))

    assert reply.content == "after the pause"
    assert reply.attempts == 2
    assert sleeps == [3.0]


def test_a_huge_retry_after_is_capped(fake, sleeps, make_client):
    fake.push(HttpError(429, headers={"Retry-After": "86400"}), Text("ok"))

    complete(make_client(fake, sleeps))

    assert sleeps == [30.0]


def test_backoff_grows_exponentially_with_jitter(fake, sleeps, make_client):
    fake.push(HttpError(503), HttpError(502), HttpError(500), Text("ok"))

    reply = complete(make_client(fake, sleeps, max_retries=3))

    assert reply.attempts == 4
    assert 0.25 <= sleeps[0] <= 0.5
    assert 0.5 <= sleeps[1] <= 1.0
    assert 1.0 <= sleeps[2] <= 2.0


def test_a_server_failing_forever_gives_unavailable_after_max_retries(fake, sleeps, make_client):
    fake.default = HttpError(500)

    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps, max_retries=2))

    assert len(fake.requests) == 3
    assert raised.value.status_code == 500
    assert raised.value.attempts == 3
    assert "boom" in str(raised.value)


def test_a_bad_request_is_not_retried(fake, sleeps, make_client):
    fake.push(HttpError(400, body='{"error": {"message": "messages must not be empty"}}'))

    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps))

    assert len(fake.requests) == 1
    assert raised.value.kind == "rejected"
    assert raised.value.status_code == 400
    assert sleeps == []


def test_an_authentication_error_is_not_retried(fake, sleeps, make_client):
    fake.push(HttpError(401, body='{"error": {"message": "invalid api key"}}'))

    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps))

    assert len(fake.requests) == 1
    assert raised.value.status_code == 401


def test_a_hung_server_times_out_quickly(fake, sleeps, make_client):
    fake.default = Hang()

    started = time.monotonic()
    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps, timeout_seconds=0.5, max_retries=1))

    assert time.monotonic() - started < 3
    assert raised.value.kind == "timeout"
    assert len(fake.requests) == 2


def test_the_timeout_argument_overrides_the_setting(fake, sleeps, make_client):
    fake.push(Hang())

    started = time.monotonic()
    with pytest.raises(LLMUnavailable):
        complete(make_client(fake, sleeps, timeout_seconds=60, max_retries=0), timeout=0.3)

    assert time.monotonic() - started < 2


def test_a_refused_connection_is_retried_then_unavailable(sleeps, make_client):
    closed = FakeLLM().start()
    client = make_client(closed, sleeps, max_retries=1)
    closed.stop()

    with pytest.raises(LLMUnavailable) as raised:
        complete(client)

    assert raised.value.kind == "connection"
    assert raised.value.attempts == 2


def test_a_garbage_body_is_a_bad_response_after_one_retry(fake, sleeps, make_client):
    fake.default = Garbage()

    with pytest.raises(LLMBadResponse):
        complete(make_client(fake, sleeps, max_retries=5))

    assert len(fake.requests) == 2


def test_one_garbage_body_then_a_good_one_succeeds(fake, sleeps, make_client):
    fake.push(Garbage(), Text("recovered"))

    reply = complete(make_client(fake, sleeps))

    assert (reply.content, reply.attempts) == ("recovered", 2)


def test_a_body_without_choices_is_a_bad_response(fake, sleeps, make_client):
    fake.default = Garbage(b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}')

    with pytest.raises(LLMBadResponse):
        complete(make_client(fake, sleeps, max_retries=0))


def test_malformed_tool_call_arguments_are_a_bad_response(fake, sleeps, make_client):
    fake.default = ToolCalls([("read_file", '{"path": "USER.md"')])

    with pytest.raises(LLMBadResponse) as raised:
        complete(make_client(fake, sleeps), tools=[READ_FILE_TOOL])

    assert "read_file" in str(raised.value)
    assert len(fake.requests) == 2


def test_tool_call_arguments_that_are_not_an_object_are_a_bad_response(fake, sleeps, make_client):
    fake.push(ToolCalls([("read_file", '["USER.md"]')]))

    with pytest.raises(LLMBadResponse):
        complete(make_client(fake, sleeps, max_retries=0), tools=[READ_FILE_TOOL])


def test_the_api_key_never_reaches_the_logs_or_the_error(fake, sleeps, make_client):
    leaky_body = json.dumps({"error": {"message": f"upstream said: key {API_KEY} / Bearer {API_KEY}"}})
    fake.default = HttpError(503, body=leaky_body)
    lines: list[str] = []
    handler_id = logger.add(lines.append, level="DEBUG", format="{level} {message}")
    try:
        with pytest.raises(LLMUnavailable) as raised:
            complete(make_client(fake, sleeps, max_retries=2))
    finally:
        logger.remove(handler_id)

    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 2
    assert "attempt 1 of 3" in warnings[0] and "attempt 2 of 3" in warnings[1]
    assert all("http 503 ServiceUnavailableError" in line for line in warnings)
    assert API_KEY not in "".join(lines)
    assert API_KEY not in str(raised.value)
    assert "[redacted]" in warnings[0]
