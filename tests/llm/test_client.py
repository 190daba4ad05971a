"""The LLM adapter, through litellm for real (in the worker process), against an OpenAI-compatible server on
127.0.0.1: replies, tool calls, concurrency, cancelling, offline mode. How calls fail: test_failures.py."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import LLMClient
from nanobotd.llm.failures import LLMUnavailable
from nanobotd.llm.reply import LLMReply, ToolCall, UsageMeter
from tests.llm.calls import API_KEY, READ_FILE_TOOL, USER_TURN, complete
from tests.support.fakellm import Empty, Hang, HttpError, Responder, Text, ToolCalls

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_text_reply_comes_back_with_its_usage(fake, sleeps, make_client):
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


def test_the_settings_and_call_arguments_reach_the_server(fake, sleeps, make_client):
    complete(make_client(fake, sleeps, max_tokens=1234), temperature=0.3)
    complete(make_client(fake, sleeps), max_tokens=99)

    assert fake.requests[0]["max_tokens"] == 1234
    assert fake.requests[0]["temperature"] == 0.3
    assert fake.requests[1]["max_tokens"] == 99
    assert fake.requests[1]["temperature"] == 0.0
    assert "tools" not in fake.requests[0]


def test_a_tool_call_is_parsed_and_the_tools_were_sent(fake, sleeps, make_client):
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


def test_the_assistant_message_carries_the_tool_calls_into_the_next_turn(fake, sleeps, make_client):
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


def test_empty_tool_call_arguments_mean_no_arguments(fake, sleeps, make_client):
    fake.push(ToolCalls([("list_files", "")]))

    reply = complete(make_client(fake, sleeps))

    assert reply.tool_calls[0].arguments == {}


def test_an_empty_message_is_an_empty_reply_not_an_error(fake, sleeps, make_client):
    fake.push(Empty())

    reply = complete(make_client(fake, sleeps))

    assert reply.content == ""
    assert reply.tool_calls == ()
    assert (reply.prompt_tokens, reply.completion_tokens) == (0, 0)
    assert reply.assistant_message() == {"role": "assistant", "content": ""}


def test_a_truncated_reply_reports_finish_reason_length(fake, sleeps, make_client):
    fake.push(Text("We decided to", finish_reason="length"))

    reply = complete(make_client(fake, sleeps))

    assert reply.finish_reason == "length"
    assert reply.content == "We decided to"


def test_a_local_server_gets_a_placeholder_key_when_none_is_configured(fake, sleeps, make_client):
    complete(make_client(fake, sleeps, api_key=None))

    assert fake.request_headers[0]["authorization"] == "Bearer sk-none"


def test_concurrent_calls_are_limited_by_the_concurrency_setting(fake, sleeps, make_client):
    fake.latency = 0.2
    client = make_client(fake, sleeps, concurrency=2)

    async def five_at_once() -> list[LLMReply]:
        return await asyncio.gather(*(client.complete(USER_TURN) for _ in range(5)))

    replies = asyncio.run(five_at_once())

    assert len(replies) == 5
    assert fake.max_in_flight == 2
    assert all(reply.latency_ms >= 150 for reply in replies)


def test_cancelling_a_call_raises_cancelled_not_an_llm_error(fake, sleeps, make_client):
    fake.default = Hang()
    client = make_client(fake, sleeps)

    async def cancel_midway() -> None:
        task = asyncio.create_task(client.complete(USER_TURN))
        await asyncio.sleep(0.3)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_midway())


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


def test_the_usage_meter_adds_up_replies_and_errors(fake, sleeps, make_client):
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


def test_a_responder_answers_from_the_request_content(fake, sleeps, make_client):
    fake.default = Responder(lambda request: Text(f"you said: {request['messages'][-1]['content']}"))

    reply = complete(make_client(fake, sleeps), [{"role": "user", "content": "ping"}])

    assert reply.content == "you said: ping"


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
