"""Dream runs cut short by a crash: rolled back (or finished, when committed) at the next start, a real SIGKILL
included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nanobotd.gitstore.store import GitStore
from nanobotd.jobs.dream.apply import recover_dream_run
from nanobotd.jobs.dreamnotes import unread_note_bullets
from nanobotd.memory.history import read_dream_cursor
from tests.jobs.dream.scenario import (
    EDIT_TWO_FILES,
    FINDINGS,
    dream,
    dream_two_files,
    git_cli,
    tree,
    write_note,
)
from tests.support.fakellm import Text

REPO_ROOT = Path(__file__).resolve().parents[3]


class Killed(BaseException):
    """Stands for SIGKILL: nothing in the job may catch it."""


def test_a_crash_after_writing_is_rolled_back_and_the_next_dream_takes_the_same_batch(workspace, store, git, fake):
    before = tree(workspace)

    def kill_after_writing(stage: str) -> None:
        if stage == "cursor_written":
            raise Killed()

    fake.push(Text(FINDINGS), EDIT_TWO_FILES, Text("done"))
    with pytest.raises(Killed):
        dream(workspace, store, git, fake, on_stage=kill_after_writing)
    assert tree(workspace) != before
    run = store.list_runs(kind="dream")[0]
    assert (run.state, run.manifest["stage"]) == ("started", "applying")
    assert recover_dream_run(run, store=store, git=git) == "rolled_back"
    assert tree(workspace) == before and store.get_run(run.run_id).state == "rolled_back"
    assert git_cli(workspace, "log", "--format=%s").splitlines()[-1] == "init: nanobot memory store"
    assert "dream: update" not in git_cli(workspace, "log", "--format=%s")
    first_prompt = fake.requests[0]["messages"]
    result = dream_two_files(workspace, store, git, fake)
    assert fake.requests[3]["messages"] == first_prompt and result.outcome == "written"


def test_a_crash_after_the_commit_is_recovered_as_finished(workspace, store, git, fake):
    def kill_after_commit(stage: str) -> None:
        if stage == "committed":
            raise Killed()

    fake.push(Text(FINDINGS), EDIT_TWO_FILES, Text("done"))
    with pytest.raises(Killed):
        dream(workspace, store, git, fake, on_stage=kill_after_commit)
    run = store.list_runs(kind="dream")[0]
    assert run.manifest["stage"] == "applying"
    restarted = GitStore(workspace)
    try:
        assert recover_dream_run(run, store=store, git=restarted) == "finished"
    finally:
        restarted.close()
    assert read_dream_cursor(workspace / "memory") == 5 and store.get_run(run.run_id).outcome == "written"


KILL_SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys
    from pathlib import Path
    from nanobotd.gitstore.store import GitStore
    from nanobotd.jobs.dream.run import DreamRun
    from nanobotd.jobs.dream.tools import StagedFiles
    from nanobotd.config.schema import WorkspaceSettings
    from nanobotd.state.store import StateStore
    from datetime import datetime

    workspace, state, run_id = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    store, git = StateStore(state).open(), GitStore(workspace)
    git.open()
    def kill(stage):
        if stage == "files_written":
            os.kill(os.getpid(), signal.SIGKILL)
    run = DreamRun(WorkspaceSettings(path=workspace, name="ws"), store=store, llm=None, git=git, run_id=run_id,
                   on_stage=kill)
    run.staged = StagedFiles(workspace)
    run.staged.run("edit_file", {"path": "USER.md", "edits": [{"old_text": "- Likes tea", "new_text": "- Likes rum"}]})
    run.manifest.update(entries=[1, 5], cursor_before=0, analysis=["[USER] likes rum"])
    run.apply(5)
""")


def test_a_real_sigkill_while_applying_is_rolled_back(workspace, store, git, tmp_path):
    before = tree(workspace)
    run_id = store.create_run("dream", "ws")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(workspace), str(tmp_path / "state"), run_id],
                             env=env, capture_output=True, text=True, timeout=30)
    assert process.returncode == -9, process.stderr
    assert "- Likes rum" in (workspace / "USER.md").read_text()
    assert recover_dream_run(store.get_run(run_id), store=store, git=git) == "rolled_back"
    assert tree(workspace) == before


def test_an_interrupted_run_that_wrote_nothing_is_closed_as_failed(workspace, store, git):
    run_id = store.create_run("dream", "ws", manifest={"stage": "editing"})
    before = tree(workspace)
    assert recover_dream_run(store.get_run(run_id), store=store, git=git) == "failed"
    assert tree(workspace) == before and store.get_run(run_id).outcome == "interrupted"


def test_a_crash_after_marking_notes_read_is_rolled_back_and_the_bullets_are_unread_again(workspace, store, git, fake):
    write_note(workspace, "2026-04-03.md", {"Decisions": ["Billing moves to PostgreSQL 16"]})
    before = tree(workspace)

    def kill_after_marking(stage: str) -> None:
        if stage == "notes_written":
            raise Killed()

    fake.push(Text(FINDINGS), EDIT_TWO_FILES, Text("done"))
    with pytest.raises(Killed):
        dream(workspace, store, git, fake, on_stage=kill_after_marking)
    assert unread_note_bullets(workspace / "memory") == []
    assert recover_dream_run(store.list_runs(kind="dream")[0], store=store, git=git) == "rolled_back"
    assert tree(workspace) == before and len(unread_note_bullets(workspace / "memory")) == 1
