#!/usr/bin/env python3
"""Run a real nanobot agent loop and feed it turns from stdin, one JSON command per line.

Runs under nanobot's own interpreter (the venv from scripts/install-nanobot.sh), never nanobotd's: it imports
only nanobot and the standard library. It builds the agent the way `nanobot agent` and `nanobot gateway` do
(config file, MCP servers, AgentLoop.from_config) and keeps AgentLoop.run() going in the background, so idle
compaction and /new archiving happen as in a long-running gateway, with sessions held in memory.

    nanobot-python scripts/nanobot_runner.py --config DIR/config.json

Commands (stdin)                                   Answers (stdout, one JSON line each)
  {"op": "turn", "session": "cli:a", "message": M}   {"ok": true, "reply": ..., "seconds": ...}
  {"op": "sleep", "seconds": S}                      {"ok": true, "seconds": ...}
  {"op": "quit"}                                     {"ok": true}
A failed command answers {"ok": false, "error": ...}. Everything nanobot prints goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

TURN_TIMEOUT_SECONDS = 120
CLOSE_TIMEOUT_SECONDS = 30


def claim_stdout() -> TextIO:
    """Keep the real stdout for answers and send everything else printed there to stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return answers


def build_agent(config_path: Path) -> tuple[Any, Any]:
    """The agent loop and MCP provider, composed as nanobot's own CLI composes them."""
    from nanobot.agent.hooks import create_file_edit_activity_hook
    from nanobot.agent.loop import AgentLoop
    from nanobot.agent.tools.mcp import MCPProvider
    from nanobot.agent.tools.registry import ToolRegistry
    from nanobot.bus.queue import MessageBus
    from nanobot.config.loader import load_config, resolve_config_env_vars, set_config_path
    from nanobot.cron.service import CronService
    from nanobot.providers.image_generation import image_gen_provider_configs
    from nanobot.utils.helpers import sync_workspace_templates

    set_config_path(config_path)
    config = resolve_config_env_vars(load_config(config_path), config_path=config_path)
    sync_workspace_templates(config.workspace_path)
    tools = ToolRegistry()
    mcp_provider = MCPProvider.from_config(config, tools)
    agent_loop = AgentLoop.from_config(
        config,
        MessageBus(),
        cron_service=CronService(config.workspace_path / "cron" / "jobs.json"),
        image_generation_provider_configs=image_gen_provider_configs(config),
        hook_factories=[create_file_edit_activity_hook],
        tool_registry=tools,
    )
    return agent_loop, mcp_provider


async def run_command(agent_loop: Any, command: dict) -> dict:
    """Carry out one command and describe the outcome."""
    started = time.monotonic()
    op = command.get("op")
    if op == "turn":
        timeout = float(command.get("timeout", TURN_TIMEOUT_SECONDS))
        response = await asyncio.wait_for(
            agent_loop.process_direct(command["message"], str(command["session"])), timeout
        )
        reply = response.content if response is not None else None
        return {"ok": True, "reply": reply, "seconds": round(time.monotonic() - started, 3)}
    if op == "sleep":
        await asyncio.sleep(float(command["seconds"]))
        return {"ok": True, "seconds": round(time.monotonic() - started, 3)}
    raise ValueError(f"unknown op {op!r}")


async def serve(config_path: Path, answers: TextIO) -> int:
    """Answer commands until quit or end of input, with the agent loop's own run() in the background."""
    agent_loop, mcp_provider = build_agent(config_path)
    await mcp_provider.connect()
    loop_task = asyncio.create_task(agent_loop.run())
    answers.write(json.dumps({"ok": True, "ready": True, "tools": sorted(agent_loop.tools.tool_names)}) + "\n")
    reader = asyncio.get_running_loop()
    try:
        while True:
            line = await reader.run_in_executor(None, sys.stdin.readline)
            if not line or not line.strip():
                break
            command = json.loads(line)
            if command.get("op") == "quit":
                break
            try:
                answer = await run_command(agent_loop, command)
            except Exception as exc:  # the caller decides what a failed step means
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            answers.write(json.dumps(answer, ensure_ascii=False) + "\n")
    finally:
        agent_loop.stop()
        loop_task.cancel()
        await asyncio.gather(loop_task, return_exceptions=True)
        await asyncio.wait_for(close_agent(agent_loop, mcp_provider), CLOSE_TIMEOUT_SECONDS)
    answers.write(json.dumps({"ok": True}) + "\n")
    return 0


async def close_agent(agent_loop: Any, mcp_provider: Any) -> None:
    """Let background work (a /new archive) finish, then close MCP sessions."""
    try:
        await agent_loop.aclose()
    finally:
        await mcp_provider.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="nanobot config.json")
    args = parser.parse_args(argv)
    answers = claim_stdout()
    return asyncio.run(serve(args.config.expanduser().resolve(), answers))


if __name__ == "__main__":
    sys.exit(main())
