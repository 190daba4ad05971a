"""Benchmark content: conversations shaped like the ones nanobot 0.3.5 writes, with a marker per message.

Shared by the tracker and consolidation benchmarks so both measure the same kind of session file.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

WORDS = (
    "the a to of and in for on with deploy script kestrel staging server debian config nginx certificate "
    "renew cron backup database migration postgres index query latency budget invoice report quarterly "
    "meeting thursday dentist python tabs spaces review branch merge release notes customer ticket error "
    "timeout retry queue worker memory disk usage cluster node restart service log rotate alert threshold "
    "dashboard metric weekly plan draft email reply schedule flight hotel booking receipt expense summary "
    "please could you check why does it fail again after update yesterday tomorrow morning evening because "
    "version 3.11 2026 port 8080 /etc/nginx/nginx.conf ~/projects/kestrel README.md TODO FIXME ok thanks"
).split()
TOOLS = ("read_file", "exec", "web_search", "list_dir", "edit_file")


def _words(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def _stamp(clock: datetime) -> str:
    return clock.isoformat(timespec="microseconds")


def nanobot_conversation(count: int, *, tag: str = "s", seed: int = 0,
                         start: datetime | None = None) -> list[dict]:
    """*count* messages shaped like nanobot 0.3.5 turns: user, tool calls and results, assistant reply.

    Every message carries a unique marker `MSG-<tag>-<index>` in its content, so an archive can be checked.
    """
    rng = random.Random(f"{tag}:{seed}")
    clock = start or datetime(2026, 11, 1, 9, 0)
    messages: list[dict] = []

    def add(message: dict) -> None:
        nonlocal clock
        clock += timedelta(seconds=rng.randint(1, 40), microseconds=rng.randint(0, 999_999))
        message["content"] = f"MSG-{tag}-{len(messages)} {message['content']}"
        message["timestamp"] = _stamp(clock)
        messages.append(message)

    while len(messages) < count:
        add({"role": "user", "content": _words(rng, 12, 70)})
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            call_id = f"call_{rng.getrandbits(48):012x}"
            tool = rng.choice(TOOLS)
            arguments = {"path": f"~/projects/kestrel/{rng.choice(WORDS)}.md"} if tool != "exec" else {
                "command": f"systemctl status {rng.choice(WORDS)} --no-pager"}
            add({"role": "assistant", "content": _words(rng, 3, 12), "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}]})
            output = "\n".join(f"{index + 1}: {_words(rng, 4, 14)}" for index in range(rng.randint(3, 30)))
            add({"role": "tool", "tool_call_id": call_id, "name": tool, "content": output})
        reply = {"role": "assistant", "content": _words(rng, 15, 150), "latency_ms": rng.randint(300, 4000)}
        if rng.random() < 0.2:
            reply["reasoning_content"] = _words(rng, 10, 60)
        add(reply)
    return messages[:count]
