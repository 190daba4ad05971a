"""nanobotd/cli/commands/mcp.py: `nanobotctl mcp` spawned over stdio by the real MCP client, against a real daemon;
then fed raw bytes, where every request gets a reply, in order: the next line read after sending is the answer."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from nanobotd.api.server import ControlServer
from nanobotd.cli.agent_tools import MAX_RESULT_CHARS
from tests.cli.fakedaemon import NANOBOTCTL, FakeDaemon, ServerThread
from tests.cli.twoworkspaces import OTHER_NOTE_DAY, SECRET
from tests.support.daemonproc import REPO, DaemonProcess
from tests.support.workspace import make_workspace

REPLY_WAIT_SECONDS = 30  # a hang fails the test instead of blocking it; no reply is expected to take long
NOTE = "# 2026-11-20\n\n## Decisions\n- The backup host is called osprey.\n- Ship kestrel on Friday.\n"
HISTORY = {"cursor": 1, "timestamp": "2026-11-19 17:05", "content": "Planned the kestrel launch party.",
           "session_key": "telegram:42"}


@pytest.fixture
def daemon(tmp_path: Path):
    """A real nanobotd (offline) over a workspace holding one daily note and one history entry."""
    workspace, _ = make_workspace(tmp_path, layout="current")
    (workspace / "memory" / "2026-11-20.md").write_text(NOTE)
    (workspace / "memory" / "history.jsonl").write_text(json.dumps(HISTORY) + "\n")
    proc = DaemonProcess(tmp_path, workspace, extra_config="[search]\ndebounce_seconds = 0.2\n").start()
    yield proc
    proc.kill()


def call_tools(socket: Path, calls: list[tuple[str, dict]], *extra_args: str, until: str = "") -> dict:
    """Spawn `nanobotctl mcp --socket SOCKET` through the MCP stdio client; list its tools and make *calls*.

    The child gets what nanobot gives it: the SDK's few inherited variables plus the configured env
    (here only PYTHONPATH, so it runs this tree). With *until*, the first call is repeated until its text
    holds that word (the daemon indexes the workspace in the background after it starts).
    """
    params = StdioServerParameters(command=str(NANOBOTCTL), args=["mcp", "--socket", str(socket), *extra_args],
                                   env={"PYTHONPATH": str(REPO)})

    async def session() -> dict:
        async with stdio_client(params) as (read_stream, write_stream):
            async with ClientSession(read_stream, write_stream) as client:
                await client.initialize()
                listed = await client.list_tools()
                results = [await client.call_tool(name, arguments) for name, arguments in calls]
                deadline = time.monotonic() + 20
                while until and until not in text_of(results[0]) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    results[0] = await client.call_tool(*calls[0])
                return {"tools": {tool.name: tool for tool in listed.tools}, "results": results}

    return asyncio.run(asyncio.wait_for(session(), 60))


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def test_memory_search_returns_a_known_fact_with_its_source_and_date(daemon: DaemonProcess) -> None:
    result = call_tools(daemon.socket, [("memory_search", {"query": "backup host", "limit": 5})],
                        until="osprey")["results"][0]
    text = text_of(result)
    assert not result.is_error, text
    assert "The backup host is called osprey." in text
    assert "memory/2026-11-20.md" in text and "2026-11-20" in text
    assert len(text) < MAX_RESULT_CHARS


def test_memory_recall_returns_the_daily_note_of_a_date_and_the_history_of_a_range(daemon: DaemonProcess) -> None:
    one_day, two_days = call_tools(daemon.socket, [("memory_recall", {"date": "2026-11-20"}),
                                                   ("memory_recall", {"date": "2026-11-19..2026-11-20"})])["results"]
    assert not one_day.is_error, text_of(one_day)
    assert "2026-11-20 · daily note · memory/2026-11-20.md" in text_of(one_day)
    assert "Ship kestrel on Friday." in text_of(one_day)
    assert "Planned the kestrel launch party." not in text_of(one_day)
    text = text_of(two_days)
    assert text.index("2026-11-19 17:05 · history #1 · session telegram:42") < text.index("Ship kestrel")


def test_memory_context_and_a_refused_request_answer_as_text(daemon: DaemonProcess) -> None:
    context, bad_range = call_tools(daemon.socket, [("memory_context", {"query": "kestrel", "budget_tokens": 800}),
                                                    ("memory_recall", {"date": "2026-11-20..2026-11-01"})])["results"]
    assert not context.is_error and "of 800 tokens" in text_of(context)
    assert "Ship kestrel on Friday." in text_of(context)
    assert "Project kestrel." not in text_of(context)  # MEMORY.md is in the agent's prompt already
    assert bad_range.is_error and "ends before it starts" in text_of(bad_range)
    unknown = call_tools(daemon.socket, [("memory_search", {"query": "x"})], "--workspace", "nope")["results"][0]
    assert unknown.is_error and text_of(unknown).startswith("nanobotd could not answer: no workspace named 'nope'")


def test_with_the_daemon_down_the_tools_are_listed_and_answer_how_to_start_it(tmp_path: Path) -> None:
    answer = call_tools(tmp_path / "none.sock", [("memory_search", {"query": "osprey"}),
                                                 ("memory_recall", {"date": "2026-11-20"})])
    tools = answer["tools"]
    assert sorted(tools) == ["memory_context", "memory_recall", "memory_search"]
    assert tools["memory_search"].input_schema["required"] == ["query"]
    assert tools["memory_recall"].input_schema["required"] == ["date"]
    for tool in tools.values():
        assert "Use it" in tool.description and len(tool.description) > 200
    for result in answer["results"]:
        assert result.is_error
        assert "nanobotd, the memory daemon, is not running" in text_of(result)
        assert "nanobotd run --workspace DIR" in text_of(result) and str(tmp_path / "none.sock") in text_of(result)


def test_a_server_bound_to_one_workspace_refuses_another_workspaces_session_and_name(two_workspaces) -> None:
    socket = two_workspaces.daemon.socket
    other = call_tools(socket, [("memory_search", {"query": "vault code"}),
                                ("memory_context", {"session_key": "telegram:other"}),
                                ("memory_recall", {"date": OTHER_NOTE_DAY})], "--workspace", "other",
                       until="heron-7731")["results"]
    assert all(not result.is_error for result in other), [text_of(result) for result in other]
    assert SECRET in text_of(other[0]) and SECRET in text_of(other[1]) and "herons" in text_of(other[2])

    search, context, recall, named, plain = call_tools(socket, [
        ("memory_search", {"query": "vault code"}), ("memory_context", {"session_key": "telegram:other"}),
        ("memory_recall", {"date": OTHER_NOTE_DAY}), ("memory_search", {"query": "vault", "workspace": "other"}),
        ("memory_context", {"session_key": "telegram:home"})], "--workspace", "ws")["results"]
    assert not search.is_error and "heron-7731" not in text_of(search)
    assert context.is_error and text_of(context) == (
        "nanobotd could not answer: session 'telegram:other' belongs to another workspace, not 'ws'; "
        "this request may read only workspace 'ws'")
    assert not recall.is_error and text_of(recall).startswith(f"Nothing recorded for {OTHER_NOTE_DAY}")
    assert named.is_error and text_of(named) == "this memory server answers only for workspace 'ws', not 'other'"
    assert not plain.is_error and "Project kestrel." in text_of(plain) and "heron-7731" not in text_of(plain)


def test_a_server_bound_to_no_workspace_refuses_every_tool_while_the_daemon_manages_several(two_workspaces) -> None:
    results = call_tools(two_workspaces.daemon.socket, [("memory_context", {"session_key": "telegram:other"}),
                                                        ("memory_search", {"query": "vault"}),
                                                        ("memory_recall", {"date": OTHER_NOTE_DAY})])["results"]
    for result in results:
        assert result.is_error and text_of(result).startswith(
            "nanobotd manages 2 workspaces (other, ws) and this memory server is bound to none; run "
            "`nanobotctl setup nanobot --apply`"), text_of(result)


def test_the_memory_tools_refuse_a_server_in_a_folder_another_user_made(tmp_path: Path) -> None:
    socket_path = Path(tempfile.mkdtemp(prefix="nbm-", dir="/tmp")) / "nanobotd-1000" / "nanobotd.sock"
    impostor = FakeDaemon()  # answers every search with its own text
    try:
        with ServerThread(ControlServer(socket_path, impostor.router)):
            os.chown(socket_path.parent, 65534, 65534)  # squatted by uid 65534 (nobody)
            result = call_tools(socket_path, [("memory_search", {"query": "spare key"})])["results"][0]
    finally:
        shutil.rmtree(socket_path.parent.parent, ignore_errors=True)
    text = text_of(result)
    assert result.is_error and "belongs to uid 65534" in text, text
    assert impostor.requests == []


class RawServer:
    """`nanobotctl mcp` as nanobot starts it, fed raw lines; initialized before the first test line."""

    def __init__(self, socket: Path) -> None:
        self.proc = subprocess.Popen([str(NANOBOTCTL), "mcp", "--socket", str(socket)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]})
        initialized = self.ask({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert "result" in initialized, initialized
        self.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode())

    def send(self, line: bytes) -> None:
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_WAIT_SECONDS)
        assert ready, "no reply"
        return json.loads(self.proc.stdout.readline())

    def ask(self, message: dict | bytes) -> dict:
        self.send(message if isinstance(message, bytes) else json.dumps(message).encode())
        return self.reply()

    def close(self) -> tuple[int, str]:
        self.proc.stdin.close()
        code = self.proc.wait(REPLY_WAIT_SECONDS)
        return code, self.proc.stderr.read().decode()


def call(request_id: int, arguments: dict, name: str = "memory_search") -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name,
                                                                                   "arguments": arguments}}


@pytest.fixture
def server(daemon: DaemonProcess):
    raw = RawServer(daemon.socket)
    yield raw
    if raw.proc.poll() is None:
        raw.proc.kill()


def error_of(reply: dict, request_id) -> tuple[int, str]:
    assert reply["id"] == request_id and "result" not in reply, reply
    return reply["error"]["code"], reply["error"]["message"]


def tool_text(reply: dict, request_id: int) -> tuple[bool, str]:
    assert reply["id"] == request_id and "error" not in reply, reply
    return reply["result"].get("isError", False), reply["result"]["content"][0]["text"]


def test_malformed_messages_get_json_rpc_errors_and_the_server_keeps_serving(server: RawServer) -> None:
    assert error_of(server.ask(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/c'), None)[0] == -32700
    assert error_of(server.ask(b"\xff\xfe{}"), None)[0] == -32700
    assert error_of(server.ask(b"[" * 100_000 + b"]" * 100_000), None) == (
        -32700, "Parse error: not a JSON text (nested too deeply)")
    assert error_of(server.ask(b"[1, 2]"), None)[0] == -32600
    assert error_of(server.ask({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": [1, 2]}), 2) == (
        -32602, "Invalid params: params must be an object, not an array")
    assert error_of(server.ask({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": "x"}), 3)[0] == -32602
    surrogate = b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "memory_search", ' \
                b'"arguments": {"query": "kestrel \\ud800"}}}'
    assert error_of(server.ask(surrogate), 4)[0] == -32602
    assert error_of(server.ask({"jsonrpc": "1.0", "id": 5, "method": "tools/list"}), 5)[0] == -32600
    assert error_of(server.ask({"id": 7, "method": "tools/call", "params": [1]}), 7)[0] == -32600  # no "jsonrpc"
    assert error_of(server.ask({"id": 8, "method": "tools/list"}), 8)[0] == -32600
    assert error_of(server.ask(b'{"q": "' + b"x" * (5 << 20) + b'"}'), None) == (
        -32600, "Invalid Request: message over 4194304 bytes")
    server.send(b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1]}')  # no reply, ever
    is_error, text = tool_text(server.ask(call(6, {"query": "kestrel"})), 6)
    assert not is_error, text
    code, stderr = server.close()
    assert code == 0 and "Traceback" not in stderr, stderr


def test_an_infinite_limit_and_a_megabyte_query_are_tool_errors_without_a_traceback(server: RawServer) -> None:
    infinite = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "memory_search", ' \
               b'"arguments": {"query": "kestrel", "limit": 1e400}}}'
    assert tool_text(server.ask(infinite), 1) == (True, "the 'limit' argument must be a whole number, not inf")
    is_error, text = tool_text(server.ask(call(2, {"query": "kestrel " * 131_072})), 2)
    assert is_error and text.startswith("the 'query' argument is too long (1,048,575 characters)"), text
    is_error, text = tool_text(server.ask(call(3, {"query": "word " * 130_000}, "memory_context")), 3)
    assert is_error and "too long" in text
    code, stderr = server.close()
    assert code == 0 and "Traceback" not in stderr, stderr
