"""A real daemon whose LLM is the fake OpenAI-compatible server, on a workspace in nanobot's current layout."""

from __future__ import annotations

from tests.support.fakellm import Text, ToolCalls
from tests.support.workspace import make_workspace

USER = "# User\n\n## Preferences\n- Likes tea.\n"


def llm_daemon(tmp_path, fake, daemon_process):
    """The daemon (not started) with `.workspace` and `.sessions`; USER.md holds USER."""
    workspace, sessions = make_workspace(tmp_path, layout="current")
    (workspace / "USER.md").write_text(USER)
    proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
timeout_seconds = 10
max_retries = 0

[search]
debounce_seconds = 0.2
""")
    proc.workspace, proc.sessions = workspace, sessions
    return proc


def push_tea_to_coffee_dream(fake) -> None:
    """The fake model's answers for one dream that changes USER's "- Likes tea." into "- Likes coffee."."""
    fake.push(Text("[USER] correction: drinks coffee, not tea"),
              ToolCalls([("edit_file", {"path": "USER.md",
                                        "edits": [{"old_text": "- Likes tea.", "new_text": "- Likes coffee."}]})]),
              Text("done"))
