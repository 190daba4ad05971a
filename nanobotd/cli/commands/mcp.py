"""`nanobotctl mcp`: the memory tools as an MCP server on stdio, each call forwarded to the daemon's socket.

nanobot gives the child no XDG_RUNTIME_DIR, so the socket comes from --socket (`nanobotctl setup nanobot` writes
it). `mcp` and `agent_tools` are imported inside the command: every other command stays quick to start.
"""

from __future__ import annotations

import sys
from typing import Any

from nanobotd import __version__
from nanobotd.cli.client import Client
from nanobotd.cli.invocation import EXIT_DAEMON_ERROR, EXIT_OK, Invocation

SERVER_NAME = "nanobotd"
# nanobot gives up on a tool call after toolTimeout (30 s by default); answer before it does.
MAX_CALL_SECONDS = 25.0
INSTRUCTIONS = ("Long-term memory kept by nanobotd: memory_search finds past conversations, history and notes "
                "by keywords; memory_recall reads what was recorded on given days; memory_context assembles "
                "a budgeted memory context.")


def serve(invocation: Invocation) -> int:
    """Serve the memory tools on stdin/stdout until the client closes stdin; stdout carries only MCP."""
    client = Client(invocation.client.socket_path, min(invocation.client.timeout, MAX_CALL_SECONDS),
                    invocation.client.workspace)
    try:
        import anyio
        from mcp.server.stdio import stdio_server

        from nanobotd.cli.mcp_framing import CheckedLines  # here, not at the top: only this command needs it

        server = build_server(client)
    except ImportError as exc:
        invocation.warn(f"the MCP server needs the `mcp` package ({exc}); reinstall nanobotd with its dependencies")
        return EXIT_DAEMON_ERROR

    async def run() -> None:
        replies, pending_replies = anyio.create_memory_object_stream(16)
        lines = CheckedLines(sys.stdin.buffer, replies)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):
            async with anyio.create_task_group() as group:
                group.start_soon(lines.forward, pending_replies, write_stream)
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
