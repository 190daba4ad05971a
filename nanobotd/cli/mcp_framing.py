"""The check every line `nanobotctl mcp` reads gets before the MCP SDK sees it, so a bad message gets an error.

The SDK's stdio transport drops a line it cannot validate without a reply (the client then waits for its
timeout); JSON-RPC 2.0 wants an error reply with the request's id (null without one; none to a notification).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, BinaryIO, NamedTuple

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a tool call is a few hundred bytes; a query is capped far below this
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602


class Checked(NamedTuple):
    """A line's verdict: `message` to hand on, or `reply` (the error to send; None for a bad notification)."""

    message: dict | None
    reply: dict | None = None


def check_line(line: bytes) -> Checked:
    """Parse one newline-delimited message; the parsed object when the SDK can take it, else the error."""
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return Checked(None, error_reply(None, PARSE_ERROR, f"Parse error: not a JSON text ({brief(exc)})"))
    if not isinstance(message, dict):
        return Checked(None, error_reply(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object "
                                                                "(batches are not part of MCP)"))
    request_id = message.get("id")
    has_id = isinstance(request_id, (str, int)) and not isinstance(request_id, bool)
    if "method" in message and "params" in message and not isinstance(message["params"], dict):
        problem = f"Invalid params: params must be an object, not {json_type(message['params'])}"
        return Checked(None, error_reply(request_id, INVALID_PARAMS, problem) if has_id else None)
    try:
        json.dumps(message, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        problem = "a string holds a lone surrogate (such as \\ud800), which is not text"
        if "method" in message:
            return Checked(None, error_reply(request_id, INVALID_PARAMS, f"Invalid params: {problem}")
                           if has_id else None)
        return Checked(None, error_reply(request_id if has_id else None, INVALID_REQUEST,
                                         f"Invalid Request: {problem}"))
    return Checked(message)


def too_long_reply() -> dict:
    """The error for a line longer than MAX_MESSAGE_BYTES, which is skipped unread to its end."""
    return error_reply(None, INVALID_REQUEST, f"Invalid Request: message over {MAX_MESSAGE_BYTES} bytes")


def invalid_reply(message: dict, problem: str) -> dict | None:
    """The error for a parsed message the SDK's own schema refuses (None for a notification)."""
    request_id = message.get("id")
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
        return None if "method" in message else error_reply(None, INVALID_REQUEST, f"Invalid Request: {problem}")
    code = INVALID_PARAMS if message.get("jsonrpc") == "2.0" and isinstance(message.get("method"), str) \
        else INVALID_REQUEST
    return error_reply(request_id, code, f"{'Invalid params' if code == INVALID_PARAMS else 'Invalid Request'}: "
                                         f"{problem}")


def error_reply(request_id: Any, code: int, message: str) -> dict:
    """A JSON-RPC 2.0 error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def json_type(value: Any) -> str:
    """The JSON name of *value*'s type, for a message about it."""
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null", int: "a number",
             float: "a number"}
    return names.get(type(value), type(value).__name__)


def brief(exc: BaseException) -> str:
    """The first line of an exception's message, short enough for an error reply."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


class CheckedLines:
    """stdin for the SDK's stdio_server: the messages it can serve, as lines; every other one answered with an
    error sent through *replies* to `forward`, onto the SDK's write stream (one writer alone frames stdout)."""

    def __init__(self, stdin: BinaryIO, replies: Any) -> None:
        self.stdin = stdin
        self.replies = replies

    def __aiter__(self) -> AsyncIterator[str]:
        return self.lines()

    async def lines(self) -> AsyncIterator[str]:
        import anyio
        import mcp_types as types
        from pydantic import ValidationError

        async with self.replies:
            while line := await anyio.to_thread.run_sync(self.stdin.readline, MAX_MESSAGE_BYTES + 1):
                if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
                    await anyio.to_thread.run_sync(self.skip_line)
                    await self.replies.send(too_long_reply())
                    continue
                if not line.strip():
                    continue
                checked = check_line(line)
                if checked.message is not None:
                    try:
                        types.jsonrpc_message_adapter.validate_python(checked.message, by_name=False)
                    except ValidationError as exc:
                        error = exc.errors()[0]
                        problem = f"{'.'.join(map(str, error['loc'][1:])) or 'message'}: {error['msg']}"
                        checked = Checked(None, invalid_reply(checked.message, problem))
                    else:
                        yield line.decode("utf-8")
                        continue
                if checked.reply is not None:
                    await self.replies.send(checked.reply)

    def skip_line(self) -> None:
        """Read past the rest of an over-long line, a bounded chunk at a time."""
        while (chunk := self.stdin.readline(MAX_MESSAGE_BYTES)) and not chunk.endswith(b"\n"):
            pass

    @staticmethod
    async def forward(pending_replies: Any, write_stream: Any) -> None:
        """Send each error reply on the SDK's write stream."""
        import mcp_types as types
        from mcp.shared.message import SessionMessage

        async with pending_replies:
            async for reply in pending_replies:
                await write_stream.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(reply)))
