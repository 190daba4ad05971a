"""`nanobotctl mcp`: the memory tools as an MCP server on stdio, each call forwarded to the daemon's socket.

nanobot gives the child no XDG_RUNTIME_DIR, so the socket comes from --socket (`nanobotctl setup nanobot` writes it).
`mcp` and `agent_tools` are imported inside the command, so every other command starts quick. Each line read is checked
before the SDK sees it: its stdio transport drops a line it cannot validate without a reply (the client then waits for
its timeout), where JSON-RPC 2.0 wants an error reply with the request's id (null without; none to a notification)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

from nanobotd import __version__
from nanobotd.cli.client import Client
from nanobotd.cli.invocation import EXIT_DAEMON_ERROR, EXIT_OK, Invocation

SERVER_NAME = "nanobotd"
# nanobot gives up on a tool call after toolTimeout (30 s by default); answer before it does.
MAX_CALL_SECONDS = 25.0
INSTRUCTIONS = ("Long-term memory kept by nanobotd: memory_search finds past conversations, history and notes "
                "by keywords; memory_recall reads what was recorded on given days; memory_context assembles "
                "a budgeted memory context.")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a tool call is a few hundred bytes; a query is capped far below this
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", type(None): "null", int: "a number",
              float: "a number"}


def serve(invocation: Invocation) -> int:
    """Serve the memory tools on stdin/stdout until the client closes stdin; stdout carries only MCP."""
    client = Client(invocation.client.socket_path, min(invocation.client.timeout, MAX_CALL_SECONDS),
                    invocation.client.workspace)
    try:
        import anyio
        from mcp.server.stdio import stdio_server

        server = build_server(client)
    except ImportError as exc:
        invocation.warn(f"the MCP server needs the `mcp` package ({exc}); reinstall nanobotd with its dependencies")
        return EXIT_DAEMON_ERROR

    async def run() -> None:
        replies, pending_replies = anyio.create_memory_object_stream(16)
        async with stdio_server(stdin=checked_lines(sys.stdin.buffer, replies)) as (read_stream, write_stream):
            async with anyio.create_task_group() as group:
                group.start_soon(forward_replies, pending_replies, write_stream)
                await server.run(read_stream, write_stream, server.create_initialization_options())
                group.cancel_scope.cancel()

    anyio.run(run)
    return EXIT_OK


def build_server(client: Client) -> Any:
    """A low-level MCP server listing agent_tools.TOOLS and running each call on a worker thread."""
    import anyio
    from mcp import types
    from mcp.server.lowlevel import Server

    from nanobotd.cli import agent_tools  # here, not at the top: only this command needs it

    tools = [types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema)
             for spec in agent_tools.TOOLS]

    async def list_tools(context: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(context: Any, params: Any) -> Any:
        # The client blocks on its socket; a thread keeps the server answering pings meanwhile.
        text, is_error = await anyio.to_thread.run_sync(agent_tools.call_tool, client, params.name,
                                                        params.arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)

    return Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


async def checked_lines(stdin: BinaryIO, replies: Any) -> AsyncIterator[str]:
    """stdin for the SDK's stdio_server: the messages it can serve, as lines; every other one answered with an
    error sent through *replies* to `forward_replies` (one writer alone frames stdout)."""
    import anyio

    async with replies:
        while line := await anyio.to_thread.run_sync(stdin.readline, MAX_MESSAGE_BYTES + 1):
            if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
                # Read past the rest of the over-long line, a bounded chunk at a time.
                while (chunk := await anyio.to_thread.run_sync(stdin.readline, MAX_MESSAGE_BYTES)) \
                        and not chunk.endswith(b"\n"):
                    pass
                reply = error_reply(None, INVALID_REQUEST, f"Invalid Request: message over {MAX_MESSAGE_BYTES} bytes")
            elif not line.strip():
                continue
            elif (reply := check_line(line)) is False:
                yield line.decode("utf-8")
                continue
            if reply is not None:
                await replies.send(reply)


def check_line(line: bytes) -> dict | None | bool:
    """False when the SDK can take this newline-delimited message, else the error to send (None for a bad
    notification)."""
    import mcp_types as types
    from pydantic import ValidationError

    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return error_reply(None, PARSE_ERROR, f"Parse error: not a JSON text ({brief(exc)})")
    if not isinstance(message, dict):
        return error_reply(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object "
                                                  "(batches are not part of MCP)")
    if "method" in message and "params" in message and not isinstance(message["params"], dict):
        kind = JSON_TYPES.get(type(message["params"]), type(message["params"]).__name__)
        return invalid_reply(message, f"params must be an object, not {kind}")
    try:
        json.dumps(message, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return invalid_reply(message, "a string holds a lone surrogate (such as \\ud800), which is not text")
    try:
        types.jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError as exc:
        error = exc.errors()[0]
        return invalid_reply(message, f"{'.'.join(map(str, error['loc'][1:])) or 'message'}: {error['msg']}")
    return False


def invalid_reply(message: dict, problem: str) -> dict | None:
    """The error for a message the SDK refuses: none to a notification, Invalid params to a JSON-RPC 2.0 request,
    Invalid Request to anything else (no "jsonrpc": "2.0", no method name)."""
    request_id = message.get("id")
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
        return None if "method" in message else error_reply(None, INVALID_REQUEST, f"Invalid Request: {problem}")
    if message.get("jsonrpc") == "2.0" and isinstance(message.get("method"), str):
        return error_reply(request_id, INVALID_PARAMS, f"Invalid params: {problem}")
    return error_reply(request_id, INVALID_REQUEST, f"Invalid Request: {problem}")


def error_reply(request_id: Any, code: int, message: str) -> dict:
    """A JSON-RPC 2.0 error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def brief(exc: BaseException) -> str:
    """The first line of an exception's message, short enough for an error reply."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


async def forward_replies(pending_replies: Any, write_stream: Any) -> None:
    """Send each error reply on the SDK's write stream."""
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    async with pending_replies:
        async for reply in pending_replies:
            await write_stream.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(reply)))
