"""nanobotd/cli/mcp_framing.py: raw bytes to a real `nanobotctl mcp` over stdio, a real daemon behind it.

Every request gets a reply, in order: the next line read after sending is the answer to what was sent.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
from pathlib import Path

import pytest

from tests.cli.fakedaemon import NANOBOTCTL
from tests.support.daemonproc import REPO, DaemonProcess
from tests.support.workspace import make_workspace

REPLY_WAIT_SECONDS = 30  # a hang fails the test instead of blocking it; no reply is expected to take long


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
def server(tmp_path: Path):
    workspace, _ = make_workspace(tmp_path, layout="current")
    daemon = DaemonProcess(tmp_path, workspace).start()
    raw = RawServer(daemon.socket)
    yield raw
    if raw.proc.poll() is None:
        raw.proc.kill()
    daemon.kill()


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
