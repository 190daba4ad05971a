"""A first day's small surprises, through a real daemon: a dream that found nothing new says it moved only its
cursor, and nanobotd's history lock stays out of the workspace's `git status`."""

from __future__ import annotations

import subprocess

from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import conversation, make_workspace, write_session

NANOBOT_GITIGNORE = "/*\n!memory/\n!SOUL.md\n!USER.md\n!memory/MEMORY.md\n!.gitignore\n"


def git(workspace, *args) -> str:
    return subprocess.run(["git", "-C", str(workspace), *args], capture_output=True, text=True, check=True).stdout


def nanobot_repository(workspace) -> None:
    """The repository nanobot makes at its first start: its .gitignore, everything it tracks committed."""
    (workspace / ".gitignore").write_text(NANOBOT_GITIGNORE)
    git(workspace, "init", "-q")
    git(workspace, "add", "-A")
    git(workspace, "-c", "user.name=nanobot", "-c", "user.email=nanobot@localhost", "commit", "-qm", "init")


def test_a_dream_that_moved_only_its_cursor_says_so_and_the_history_lock_is_not_untracked(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    nanobot_repository(workspace)
    with FakeLLM(default=Text("- [ephemeral] the user said hello")) as fake:
        daemon = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
""")
        write_session(sessions, "cli:a", conversation(6))
        daemon.start()
        daemon.wait_for(lambda: daemon.session("cli:a"))
        consolidated = daemon.ctl("consolidate", "cli:a", "--wait", timeout=120)
        assert consolidated.returncode == 0, consolidated.stderr
        assert (workspace / "memory" / ".history.lock").exists()
        assert "memory/.history.lock" not in git(workspace, "status", "--porcelain", "--untracked-files=all")
        fake.default = Text("[SKIP]")  # the analysis finds nothing new for the memory files
        dream = daemon.ctl("dream", "--wait", timeout=120)
        assert dream.returncode == 0, dream.stderr
        assert "dream cursor" in dream.stdout and "only (no memory file changed" in dream.stdout, dream.stdout
        assert "memory/.dream_cursor" in dream.stdout
        run_id = daemon.ctl_json("runs", "--kind", "dream", "--all")["runs"][0]["run_id"]
        changes = daemon.ctl_json("run", run_id)["run"]["changes"]
        assert changes["dream_cursor"].startswith("0 -> ") and "only" in changes["dream_cursor"]
        assert "dream cursor: 0 -> " in daemon.log()
