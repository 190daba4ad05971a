"""What the LLM tests send, and the one-line way to send it."""

from __future__ import annotations

import asyncio

from nanobotd.llm.client import LLMClient
from nanobotd.llm.reply import LLMReply

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


def complete(client: LLMClient, messages=USER_TURN, **kwargs) -> LLMReply:
    """One call on a fresh event loop, as a job runs it."""
    return asyncio.run(client.complete(messages, **kwargs))
