"""Search and context through a real daemon on files written as nanobot writes them: the agent's own memory
lookups are not memory, a curated fact beats the question that asked for it, and memory_context spends its
budget on what is not in the agent's prompt already."""

from __future__ import annotations

import json

from nanobotd.daemon.skill import SKILL_PATH, SKILL_TEXT
from tests.support.workspace import make_workspace, write_session

FACT = "- Zanzibar trip: flying out on 14 March 2027, staying in Stone Town for a week."


def nanobot_turn_with_a_failed_lookup() -> list[dict]:
    """A turn as nanobot 0.3.5 saves it: the question, the tool call, the tool's result, the reply."""
    call_id = "call_7f3a"
    return [
        {"role": "user", "content": "What do you know about my zanzibar trip?", "timestamp": "2026-11-27T09:00:00"},
        {"role": "assistant", "content": "Let me search my memory for your zanzibar trip.",
         "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": "mcp_nanobotd_memory_search",
                                      "arguments": json.dumps({"query": "zanzibar trip"})}}],
         "timestamp": "2026-11-27T09:00:02"},
        {"role": "tool", "tool_call_id": call_id, "name": "mcp_nanobotd_memory_search",
         "content": "No memory matches for 'zanzibar trip'.", "timestamp": "2026-11-27T09:00:03"},
        {"role": "assistant", "timestamp": "2026-11-27T09:00:05",
         "content": "I have nothing about a zanzibar trip yet. Is there a zanzibar trip coming up?"},
        {"role": "user", "content": "ack MSG-22", "timestamp": "2026-11-27T09:01:00"},
        {"role": "assistant", "content": "Noted.", "timestamp": "2026-11-27T09:01:02"},
    ]


def test_the_fact_outranks_the_agents_own_lookups(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:direct", nanobot_turn_with_a_failed_lookup())
    memory = workspace / "memory" / "MEMORY.md"
    memory.write_text(memory.read_text() + f"\n## Travel\n{FACT}\n", encoding="utf-8")  # nanobot's write_file
    skill = workspace / SKILL_PATH
    skill.parent.mkdir(parents=True)
    skill.write_text(SKILL_TEXT, encoding="utf-8")
    daemon = daemon_process(workspace).start()
    daemon.ctl("reindex")

    hits = daemon.ctl_json("search", "zanzibar trip", "--limit", "10")["hits"]

    assert hits and hits[0]["path"] == "memory/MEMORY.md" and FACT in hits[0]["text"], hits
    shown = "\n".join(hit["text"] for hit in hits)
    assert "Let me search my memory" not in shown and "No memory matches" not in shown
    assert not daemon.ctl_json("search", "mcp_nanobotd_memory_search")["hits"]  # nor the skill file


def test_memory_context_leaves_out_what_nanobot_injects_and_fills_with_matches(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    (workspace / "AGENTS.md").write_text("# Agents\n\n" + "- Always answer in full sentences.\n" * 150)
    (workspace / "SOUL.md").write_text("# Soul\n\n" + "- Be warm and brief, never curt.\n" * 150)
    (workspace / "USER.md").write_text("# User\n\n" + "- Prefers metric units and tea.\n" * 150)
    memory = workspace / "memory" / "MEMORY.md"
    memory.write_text("# Memory\n\n## Infra\n" + "- The staging host is kestrel.\n" * 100, encoding="utf-8")
    talk = [{"role": "user" if n % 2 == 0 else "assistant",
             "content": f"Filler turn {n} about the weather and lunch plans.", "timestamp": f"2026-11-20T10:{n:02d}:00"}
            for n in range(20)]
    talk[11]["content"] = ("The zanzibar ferry leaves Dar es Salaam at 07:00 from the Kivukoni terminal; "
                           "book the Azam Marine seats two days ahead.")
    write_session(sessions, "cli:old", talk)
    write_session(sessions, "cli:asking", [{"role": "user", "content": "hello", "timestamp": "2026-11-27T08:00:00"}])
    daemon = daemon_process(workspace).start()
    daemon.ctl("reindex")

    context = daemon.ctl_json("context", "cli:asking", "--query", "zanzibar ferry", "--budget", "1000")

    names = [part["name"] for part in context["parts"]]
    assert not {"AGENTS.md", "SOUL.md", "USER.md", "memory/MEMORY.md"} & set(names), names
    assert "Kivukoni terminal" in context["text"] and "Azam Marine seats two days ahead" in context["text"]
    assert "full sentences" not in context["text"] and "staging host" not in context["text"]
    assert names[0].startswith("Search: zanzibar ferry"), names
