"""The LLM adapter, through litellm for real, against an OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from loguru import logger

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import LLMClient
from nanobotd.llm.failures import LLMBadResponse, LLMUnavailable
from nanobotd.llm.reply import LLMReply, ToolCall, UsageMeter
from tests.support.fakellm import Empty, FakeLLM, Garbage, Hang, HttpError, Responder, Text, ToolCalls

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-test-5ecret-do-not-log-0123456789"
USER_TURN = [{"role": "user", "content": "What did we decide about the backups?"}]
READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a memory file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def sleeps():
    """Backoff delays the client asked for; the waiting itself is skipped."""
    return []


def make_client(fake: FakeLLM, sleeps: list, api_key: str | None = API_KEY, **overrides) -> LLMClient:
    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    settings = LLMSettings(model=fake.model, api_base=fake.base_url, **overrides)
    return LLMClient(settings, api_key=api_key, sleep=record_sleep)


def complete(client: LLMClient, messages=USER_TURN, **kwargs) -> LLMReply:
    return asyncio.run(client.complete(messages, **kwargs))


def test_a_text_reply_comes_back_with_its_usage(fake, sleeps):
    fake.push(Text("We keep nightly backups.", prompt_tokens=42, completion_tokens=7))

    reply = complete(make_client(fake, sleeps))

    assert reply.content == "We keep nightly backups."
    assert reply.tool_calls == ()
    assert reply.finish_reason == "stop"
    assert (reply.prompt_tokens, reply.completion_tokens) == (42, 7)
    assert reply.attempts == 1
    assert reply.latency_ms > 0
    assert fake.requests[0]["messages"] == USER_TURN
    assert fake.requests[0]["model"] == "fake-model"
    assert fake.request_headers[0]["authorization"] == f"Bearer {API_KEY}"


def test_the_settings_and_call_arguments_reach_the_server(fake, sleeps):
    complete(make_client(fake, sleeps, max_tokens=1234), temperature=0.3)
    complete(make_client(fake, sleeps), max_tokens=99)

    assert fake.requests[0]["max_tokens"] == 1234
    assert fake.requests[0]["temperature"] == 0.3
    assert fake.requests[1]["max_tokens"] == 99
    assert fake.requests[1]["temperature"] == 0.0
    assert "tools" not in fake.requests[0]


def test_a_tool_call_is_parsed_and_the_tools_were_sent(fake, sleeps):
    fake.push(ToolCalls([("read_file", {"path": "memory/MEMORY.md"}), ("read_file", {"path": "USER.md"})]))

    reply = complete(make_client(fake, sleeps), tools=[READ_FILE_TOOL])

    assert fake.requests[0]["tools"] == [READ_FILE_TOOL]
    assert reply.finish_reason == "tool_calls"
    assert reply.content == ""
    assert [(call.name, call.arguments) for call in reply.tool_calls] == [
        ("read_file", {"path": "memory/MEMORY.md"}),
        ("read_file", {"path": "USER.md"}),
    ]
    first = reply.tool_calls[0]
    assert isinstance(first, ToolCall) and first.id
    assert json.loads(first.raw_arguments) == {"path": "memory/MEMORY.md"}


def test_the_assistant_message_carries_the_tool_calls_into_the_next_turn(fake, sleeps):
    fake.push(ToolCalls([("read_file", {"path": "USER.md"})]), Text("The user prefers tea."))
    client = make_client(fake, sleeps)

    async def tool_loop() -> LLMReply:
        messages = list(USER_TURN)
        reply = await client.complete(messages, tools=[READ_FILE_TOOL])
        messages.append(reply.assistant_message())
        call = reply.tool_calls[0]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "Likes tea."})
        return await client.complete(messages, tools=[READ_FILE_TOOL])

    final = asyncio.run(tool_loop())

    assert final.content == "The user prefers tea."
    sent = fake.requests[1]["messages"]
    assert sent[1]["role"] == "assistant"
    assert sent[1]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "USER.md"}'}
    assert sent[2]["tool_call_id"] == sent[1]["tool_calls"][0]["id"]


def test_a_server_error_followed_by_success_is_retried_once(fake, sleeps):
    fake.push(HttpError(500), Text("fine now"))

    reply = complete(make_client(fake, sleeps))

    assert reply.content == "fine now"
    assert reply.attempts == 2
    assert len(fake.requests) == 2
    assert len(sleeps) == 1


def test_a_rate_limit_is_retried_and_its_retry_after_is_honoured(fake, sleeps):
    fake.push(HttpError(429, headers={"Retry-After": "3"}), Text("after the pause"))

    reply = complete(make_client(fake, sleeps))

    assert reply.content == "after the pause"
    assert reply.attempts == 2
    assert sleeps == [3.0]


def test_a_huge_retry_after_is_capped(fake, sleeps):
    fake.push(HttpError(429, headers={"Retry-After": "86400"}), Text("ok"))

    complete(make_client(fake, sleeps))

    assert sleeps == [30.0]


def test_backoff_grows_exponentially_with_jitter(fake, sleeps):
    fake.push(HttpError(503), HttpError(502), HttpError(500), Text("ok"))

    reply = complete(make_client(fake, sleeps, max_retries=3))

    assert reply.attempts == 4
    assert 0.25 <= sleeps[0] <= 0.5
    assert 0.5 <= sleeps[1] <= 1.0
    assert 1.0 <= sleeps[2] <= 2.0


def test_a_server_failing_forever_gives_unavailable_after_max_retries(fake, sleeps):
    fake.default = HttpError(500)

    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps, max_retries=2))

    assert len(fake.requests) == 3
    assert raised.value.status_code == 500
    assert raised.value.attempts == 3
    assert "boom" in str(raised.value)


def test_a_bad_request_is_not_retried(fake, sleeps):
    fake.push(HttpError(400, body='{"error": {"message": "messages must not be empty"}}'))

    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps))

    assert len(fake.requests) == 1
    assert raised.value.kind == "rejected"
    assert raised.value.status_code == 400
    assert sleeps == []


def test_an_authentication_error_is_not_retried(fake, sleeps):
    fake.push(HttpError(401, body='{"error": {"message": "invalid api key"}}'))

    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps))

    assert len(fake.requests) == 1
    assert raised.value.status_code == 401


def test_a_hung_server_times_out_quickly(fake, sleeps):
    fake.default = Hang()

    started = time.monotonic()
    with pytest.raises(LLMUnavailable) as raised:
        complete(make_client(fake, sleeps, timeout_seconds=0.5, max_retries=1))

    assert time.monotonic() - started < 3
    assert raised.value.kind == "timeout"
    assert len(fake.requests) == 2


def test_the_timeout_argument_overrides_the_setting(fake, sleeps):
    fake.push(Hang())

    started = time.monotonic()
    with pytest.raises(LLMUnavailable):
        complete(make_client(fake, sleeps, timeout_seconds=60, max_retries=0), timeout=0.3)

    assert time.monotonic() - started < 2


def test_a_refused_connection_is_retried_then_unavailable(sleeps):
    closed = FakeLLM().start()
    client = make_client(closed, sleeps, max_retries=1)
    closed.stop()

    with pytest.raises(LLMUnavailable) as raised:
        complete(client)

    assert raised.value.kind == "connection"
    assert raised.value.attempts == 2


def test_a_garbage_body_is_a_bad_response_after_one_retry(fake, sleeps):
    fake.default = Garbage()

    with pytest.raises(LLMBadResponse):
        complete(make_client(fake, sleeps, max_retries=5))

    assert len(fake.requests) == 2


def test_one_garbage_body_then_a_good_one_succeeds(fake, sleeps):
    fake.push(Garbage(), Text("recovered"))

    reply = complete(make_client(fake, sleeps))

    assert (reply.content, reply.attempts) == ("recovered", 2)


def test_a_body_without_choices_is_a_bad_response(fake, sleeps):
    fake.default = Garbage(b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}')

    with pytest.raises(LLMBadResponse):
        complete(make_client(fake, sleeps, max_retries=0))


def test_malformed_tool_call_arguments_are_a_bad_response(fake, sleeps):
    fake.default = ToolCalls([("read_file", '{"path": "USER.md"')])

    with pytest.raises(LLMBadResponse) as raised:
        complete(make_client(fake, sleeps), tools=[READ_FILE_TOOL])

    assert "read_file" in str(raised.value)
    assert len(fake.requests) == 2


def test_tool_call_arguments_that_are_not_an_object_are_a_bad_response(fake, sleeps):
    fake.push(ToolCalls([("read_file", '["USER.md"]')]))

    with pytest.raises(LLMBadResponse):
        complete(make_client(fake, sleeps, max_retries=0), tools=[READ_FILE_TOOL])


def test_empty_tool_call_arguments_mean_no_arguments(fake, sleeps):
    fake.push(ToolCalls([("list_files", "")]))

    reply = complete(make_client(fake, sleeps))

    assert reply.tool_calls[0].arguments == {}


def test_an_empty_message_is_an_empty_reply_not_an_error(fake, sleeps):
    fake.push(Empty())

    reply = complete(make_client(fake, sleeps))

    assert reply.content == ""
    assert reply.tool_calls == ()
    assert (reply.prompt_tokens, reply.completion_tokens) == (0, 0)
    assert reply.assistant_message() == {"role": "assistant", "content": ""}


def test_a_truncated_reply_reports_finish_reason_length(fake, sleeps):
    fake.push(Text("We decided to", finish_reason="length"))

    reply = complete(make_client(fake, sleeps))

    assert reply.finish_reason == "length"
    assert reply.content == "We decided to"


def test_a_local_server_gets_a_placeholder_key_when_none_is_configured(fake, sleeps):
    complete(make_client(fake, sleeps, api_key=None))

    assert fake.request_headers[0]["authorization"] == "Bearer sk-none"


def test_concurrent_calls_are_limited_by_the_concurrency_setting(fake, sleeps):
    fake.latency = 0.2
    client = make_client(fake, sleeps, concurrency=2)

    async def five_at_once() -> list[LLMReply]:
        return await asyncio.gather(*(client.complete(USER_TURN) for _ in range(5)))

    replies = asyncio.run(five_at_once())

    assert len(replies) == 5
    assert fake.max_in_flight == 2
    assert all(reply.latency_ms >= 150 for reply in replies)


def test_cancelling_a_call_raises_cancelled_not_an_llm_error(fake, sleeps):
    fake.default = Hang()
    client = make_client(fake, sleeps)

    async def cancel_midway() -> None:
        task = asyncio.create_task(client.complete(USER_TURN))
        await asyncio.sleep(0.3)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_midway())


def test_the_api_key_never_reaches_the_logs_or_the_error(fake, sleeps):
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


def test_offline_mode_fails_at_once_without_importing_litellm():
    script = (
        "import asyncio, sys\n"
        "from nanobotd.config.schema import LLMSettings\n"
        "from nanobotd.llm.client import LLMClient\n"
        "from nanobotd.llm.failures import LLMUnavailable\n"
        "LLMClient(LLMSettings(model='openai/gpt-4o-mini'), api_key='x')\n"
        "client = LLMClient(LLMSettings(model='None'))\n"
        "assert client.offline and client.mode == 'offline'\n"
        "try:\n"
        "    asyncio.run(client.complete([{'role': 'user', 'content': 'hi'}]))\n"
        "except LLMUnavailable as error:\n"
        "    print('unavailable:', error)\n"
        "print('litellm imported:', 'litellm' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True
    )

    assert "unavailable: offline mode" in result.stdout
    assert "litellm imported: False" in result.stdout


def test_an_empty_model_is_offline_too():
    assert LLMClient(LLMSettings(model="")).mode == "offline"
    assert LLMClient(LLMSettings(model="openai/gpt-4o-mini")).mode == "online"


def test_the_usage_meter_adds_up_replies_and_errors(fake, sleeps):
    fake.push(Text("a", prompt_tokens=10, completion_tokens=2), HttpError(500))
    fake.push(Text("b", prompt_tokens=5, completion_tokens=1))
    client = make_client(fake, sleeps, max_retries=1)
    meter = UsageMeter()
    meter.add(complete(client))
    meter.add(complete(client))
    meter.add_error(LLMUnavailable("offline mode", kind="offline"))

    summary = meter.to_json()

    assert summary["calls"] == 2
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (15, 3)
    assert len(summary["latencies_ms"]) == 2
    assert summary["errors"] == 1
    assert summary["retries"] == 1
    assert summary["error_types"] == {"LLMUnavailable": 1}
    assert json.loads(json.dumps(summary)) == summary


def test_a_responder_answers_from_the_request_content(fake, sleeps):
    fake.default = Responder(lambda request: Text(f"you said: {request['messages'][-1]['content']}"))

    reply = complete(make_client(fake, sleeps), [{"role": "user", "content": "ping"}])

    assert reply.content == "you said: ping"


def test_the_fake_server_streams_to_a_streaming_client(fake):
    fake.push(Text("streamed words"))

    async def stream() -> str:
        from nanobotd.llm.client import import_litellm

        litellm = import_litellm()
        response = await litellm.acompletion(
            model=fake.model, messages=USER_TURN, api_base=fake.base_url, api_key="sk-none", stream=True
        )
        return "".join([chunk.choices[0].delta.content or "" async for chunk in response if chunk.choices])

    assert asyncio.run(stream()) == "streamed words"
    assert fake.requests[0]["stream"] is True


def test_the_fake_server_runs_as_a_process():
    command = [sys.executable, "-m", "tests.support.fakellm", "--port", "0", "--reply", "from a process"]
    with subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) as process:
        try:
            base_url = process.stdout.readline().strip()
            address = urlsplit(base_url)
            connection = http.client.HTTPConnection(address.hostname, address.port, timeout=5)
            request_body = json.dumps({"model": "fake-model", "messages": []})
            connection.request("POST", "/v1/chat/completions", body=request_body)
            body = json.loads(connection.getresponse().read())
            connection.request("GET", "/v1/models")
            models = json.loads(connection.getresponse().read())
            connection.close()
        finally:
            process.terminate()
            process.wait(timeout=5)

    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert body["choices"][0]["message"]["content"] == "from a process"
    assert models["data"][0]["id"] == "fake-model"
    assert process.returncode == 0
