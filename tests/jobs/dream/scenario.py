"""A workspace with SOUL.md, USER.md, MEMORY.md and five history entries, and the steps the dream tests take
over it: write daily notes, dream (scripted FakeLLM replies), restore a run, look at the files and the git log."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from nanobotd.config.schema import ContextSettings, DreamSettings, LifecycleSettings, LLMSettings, WorkspaceSettings
from nanobotd.gitstore.store import GitStore
from nanobotd.jobs.dream.restore import restore_dream
from nanobotd.jobs.dream.run import DreamResult, DreamRun
from nanobotd.state.store import StateStore
from tests.support.fakellm import FakeLLM, Text, ToolCalls
from tests.support.llmworker import llm_client

SOUL = "# Soul\n\n## Style\n- Be concise.\n"
USER = "# User\n\n## Identity\n- Name: Ada\n- Lives in Berlin\n- Works remotely\n\n## Preferences\n- Likes tea\n"
MEMORY = "# Memory\n\n## Project Context\n- Billing uses MySQL 8.\n\n## Decisions\n- No deploys on Fridays.\n"
FINDINGS = "[USER] correction: prefers coffee, not tea\n[MEMORY] billing moved to PostgreSQL 16\nsome chatter"
EDIT_USER = ToolCalls([
    ("edit_file", {"path": "USER.md", "edits": [{"old_text": "- Likes tea", "new_text": "- Likes coffee"}]})])
EDIT_MEMORY = ToolCalls([("edit_file", {"path": "memory/MEMORY.md", "edits": [
    {"old_text": "- Billing uses MySQL 8.", "new_text": "- Billing uses PostgreSQL 16."}]})])
EDIT_TWO_FILES = ToolCalls([
    ("edit_file", {"path": "USER.md", "edits": [{"old_text": "- Likes tea", "new_text": "- Likes coffee"}]}),
    ("edit_file", {"path": "memory/MEMORY.md",
                   "edits": [{"old_text": "- Billing uses MySQL 8.", "new_text": "- Billing uses PostgreSQL 16."}]}),
])


def write_history(root: Path, count: int) -> None:
    lines = [json.dumps({"cursor": n, "timestamp": f"2026-04-03 10:{n:02d}", "content": f"- [durable] fact MSG-{n}",
                         "session_key": "cli:alpha"}) for n in range(1, count + 1)]
    (root / "memory" / "history.jsonl").write_text("\n".join(lines) + "\n")


def write_note(root: Path, name: str, sections: dict[str, list[str]]) -> Path:
    """A daily note (memory/NAME) with the given sections of bullets."""
    path = root / "memory" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(f"## {section}\n" + "".join(f"- {bullet}\n" for bullet in bullets) + "\n"
                   for section, bullets in sections.items())
    path.write_text(f"# {path.stem}\n\n{body}")
    return path


def prompt_of(request: dict) -> str:
    """The user message of a request (the analysis request of a batch)."""
    return next(message["content"] for message in request["messages"] if message["role"] == "user")


def tree(root: Path) -> dict[str, bytes]:
    """Every file of the workspace but the git repository."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*"))
            if path.is_file() and ".git" not in path.relative_to(root).parts}


def git_cli(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def settings_for(workspace: Path, fake: FakeLLM | None, context: ContextSettings | None = None,
                 max_history_entries: int = 1000, **dream: object) -> WorkspaceSettings:
    llm = LLMSettings()
    if fake is not None:
        llm = LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5)
    return WorkspaceSettings(path=workspace, name="ws", llm=llm, dream=DreamSettings(**dream),
                             lifecycle=LifecycleSettings(max_history_entries=max_history_entries),
                             context=context or ContextSettings())


def dream(workspace: Path, store: StateStore, git: GitStore, fake: FakeLLM | None, *, on_stage=None,
          max_history_entries: int = 1000, context: ContextSettings | None = None,
          **overrides: object) -> DreamResult:
    settings = settings_for(workspace, fake, context, max_history_entries, **overrides)
    run_id = store.create_run("dream", "ws")
    return asyncio.run(DreamRun(settings, store=store, llm=llm_client(settings.llm), git=git, run_id=run_id,
                                on_stage=on_stage).run())


def restore(store: StateStore, git: GitStore, run_id: str, **options: object) -> tuple[str, dict]:
    restore_id = store.create_run("restore", "ws")
    result = asyncio.run(git.call(restore_dream, store.get_run(run_id), store=store, git=git,
                                  restore_run_id=restore_id, **options))
    store.finish_run(restore_id, state="finished", outcome="restored", manifest=result)
    return restore_id, result


def outcomes(store: StateStore) -> list[tuple[str, str]]:
    return [tuple(row) for row in store.query("SELECT outcome, reason FROM outcomes ORDER BY id")]


def dream_two_files(workspace, store, git, fake) -> DreamResult:
    fake.push(Text(FINDINGS), EDIT_TWO_FILES, Text("Applied both findings."))
    return dream(workspace, store, git, fake)
