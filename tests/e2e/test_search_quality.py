"""Search and context through a real daemon on files written as nanobot writes them: the agent's own memory
lookups are not memory, a curated fact beats the question that asked for it, and memory_context spends its
budget on what is not in the agent's prompt already."""

from __future__ import annotations

from tests.support.workspace import make_workspace, write_session


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
