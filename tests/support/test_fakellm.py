"""The fake LLM server answers streaming requests with server-sent events, as OpenAI-compatible servers do.

nanobot 0.3.5 always streams, so the fake must speak the chunk format its OpenAI SDK parses: content deltas,
tool-call deltas keyed by index, a finish_reason chunk, and the usage chunk it asks for. litellm checks the
format from one side; the real nanobot (installed by scripts/install-nanobot.sh) checks it from the other.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.fakellm import FakeLLM, Text, ToolCalls

REPO_ROOT = Path(__file__).resolve().parent.parent
NANOBOT_VERSION = "0.3.5"
NANOBOT_RUN_SECONDS = 120
USER_TURN = [{"role": "user", "content": "Where do the backups go?"}]
LONG_REPLY = "The nightly backups go to the kestrel bucket; restores are tested every Friday."


def installed_nanobot_python() -> Path | None:
    """The python of the venv scripts/install-nanobot.sh made, when that install completed (its stamp file)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = Path(os.environ.get("NANOBOT_VENV") or cache / "nanobotd" / f"nanobot-ai-{NANOBOT_VERSION}")
    stamp = venv / ".nanobotd-installed"
    python = venv / "bin" / "python"
    if stamp.is_file() and stamp.read_text().strip() == f"nanobot-ai=={NANOBOT_VERSION}" and python.exists():
        return python
    return None


NANOBOT_PYTHON = installed_nanobot_python()  # read at import: the autouse fixture moves HOME away


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def litellm(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm as module

    return module


def stream_with_litellm(litellm, fake: FakeLLM, **extra) -> list:
    async def collect() -> list:
        response = await litellm.acompletion(
            model=fake.model, messages=USER_TURN, api_base=fake.base_url, api_key="sk-none", stream=True, **extra
        )
        return [chunk async for chunk in response]

    return asyncio.run(collect())


def raw_post(fake: FakeLLM, body: dict) -> tuple[http.client.HTTPResponse, bytes]:
    url = urlsplit(fake.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request("POST", f"{url.path}/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response, data


def sse_payloads(data: bytes) -> list[str]:
    events = data.decode().split("\n\n")
    assert events[-1] == "", "the stream ends with a blank line"
    assert all(event.startswith("data: ") for event in events[:-1])
    return [event[len("data: "):] for event in events[:-1]]


def test_litellm_reassembles_a_streamed_text_reply(fake, litellm):
    fake.push(Text(LONG_REPLY))

    chunks = stream_with_litellm(litellm, fake)

    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == LONG_REPLY
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content) > 1
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert fake.requests[0]["stream"] is True


def test_litellm_reassembles_streamed_tool_calls(fake, litellm):
    arguments = {"query": "backup schedule for the kestrel project", "limit": 5}
    fake.push(ToolCalls([("memory_search", arguments), ("read_file", {"path": "memory/MEMORY.md"})]))

    chunks = stream_with_litellm(litellm, fake)

    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    assert [call["name"] for call in calls.values()] == ["memory_search", "read_file"]
    assert json.loads(calls[0]["arguments"]) == arguments
    assert json.loads(calls[1]["arguments"]) == {"path": "memory/MEMORY.md"}
    assert all(call["id"] for call in calls.values())
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"


def test_a_stream_is_server_sent_events_ending_in_done(fake):
    fake.push(ToolCalls([("read_file", {"path": "USER.md"})], content="Let me look."))

    response, data = raw_post(fake, {"model": "fake-model", "messages": USER_TURN, "stream": True})

    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    payloads = sse_payloads(data)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks) == "Let me look."
    opening = next(chunk["choices"][0]["delta"]["tool_calls"][0] for chunk in chunks
                   if chunk["choices"][0]["delta"].get("tool_calls"))
    assert opening["index"] == 0 and opening["type"] == "function" and opening["function"]["name"] == "read_file"
    assert opening["id"].startswith("call_")
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]
    assert not any("usage" in chunk for chunk in chunks), "no usage chunk unless the request asks for one"


def test_a_stream_ends_with_a_usage_chunk_when_the_request_asks(fake):
    fake.push(Text("short", prompt_tokens=42, completion_tokens=7))
    body = {"model": "fake-model", "messages": USER_TURN, "stream": True, "stream_options": {"include_usage": True}}

    _, data = raw_post(fake, body)

    chunks = [json.loads(payload) for payload in sse_payloads(data)[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}


def test_a_request_without_stream_still_gets_one_json_completion(fake):
    fake.push(Text("whole"))

    response, data = raw_post(fake, {"model": "fake-model", "messages": USER_TURN})

    assert response.getheader("Content-Type") == "application/json"
    assert json.loads(data)["choices"][0]["message"]["content"] == "whole"


def nanobot_config(config_dir: Path, workspace: Path, fake: FakeLLM) -> Path:
    config = {
        "agents": {"defaults": {"workspace": str(workspace), "model": "fake-model", "provider": "custom",
                                "maxTokens": 1024, "contextWindowTokens": 200000}},
        "providers": {"custom": {"apiKey": "sk-fake", "apiBase": fake.base_url}},
    }
    config_dir.mkdir(parents=True)
    path = config_dir / "config.json"
    path.write_text(json.dumps(config))
    return path


def litellm_tiktoken_dir() -> str | None:
    """The tiktoken encodings litellm ships, so nanobot counts tokens offline instead of trying a download."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    return str(folder) if folder.is_dir() else None


@pytest.mark.skipif(NANOBOT_PYTHON is None, reason="nanobot-ai 0.3.5 is not installed (run scripts/install-nanobot.sh)")
def test_the_real_nanobot_runs_a_turn_against_the_fake_and_saves_the_reply(fake, tmp_path):
    fake.push(Text(LONG_REPLY))
    config_path = nanobot_config(tmp_path / "nanobot", tmp_path / "workspace", fake)
    env = dict(os.environ, NO_COLOR="1")
    if litellm_tiktoken_dir():
        env["TIKTOKEN_CACHE_DIR"] = litellm_tiktoken_dir()
    command = [str(NANOBOT_PYTHON), "-m", "nanobot", "agent", "--config", str(config_path),
               "--session", "cli:streaming", "--message", "Where do the backups go? MSG-1", "--no-markdown"]

    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=NANOBOT_RUN_SECONDS)

    assert result.returncode == 0, result.stderr[-2000:]
    assert LONG_REPLY in " ".join(result.stdout.split())
    assert fake.requests[0]["stream"] is True
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    stem = base64.urlsafe_b64encode(b"cli:streaming").decode().rstrip("=")
    [session_file] = (tmp_path / "nanobot" / "sessions").glob(f"*/{stem}.jsonl")
    records = [json.loads(line) for line in session_file.read_text().splitlines()]
    assert records[0]["_type"] == "metadata" and records[0]["key"] == "cli:streaming"
    messages = [record for record in records if "role" in record]
    assert [message["role"] for message in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "Where do the backups go? MSG-1"
    assert messages[1]["content"] == LONG_REPLY


def test_embeddings_are_deterministic_and_close_for_texts_sharing_word_pieces() -> None:
    import json as json_module
    import urllib.request

    from tests.support.fakellm import FakeLLM, fake_embedding

    with FakeLLM() as fake:
        body = json_module.dumps({"model": "fake-embed", "input": ["destress", "stress relief"],
                                  "dimensions": 32}).encode()
        request = urllib.request.Request(fake.base_url + "/embeddings", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            answer = json_module.loads(response.read())
    first, second = (item["embedding"] for item in answer["data"])
    assert first == fake_embedding("destress", 32) and len(second) == 32
    assert sum(a * b for a, b in zip(first, second, strict=True)) > 0.4
    assert sum(a * b for a, b in zip(first, fake_embedding("pelican", 32), strict=True)) < 0.2
