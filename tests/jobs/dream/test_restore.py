"""Restoring dreams as new commits (three-way reverts, --force, dry runs) and dream-log, on real tmp git repos."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from nanobotd.jobs.dream.restore import dream_log, restore_dream
from nanobotd.jobs.dreamnotes import unread_note_bullets
from nanobotd.jobs.errors import RestoreRefused
from nanobotd.memory.history import read_dream_cursor
from tests.jobs.dream.scenario import (
    EDIT_MEMORY,
    MEMORY,
    SOUL,
    USER,
    dream,
    dream_two_files,
    git_cli,
    restore,
    tree,
    write_note,
)
from tests.support.fakellm import Text


def test_restore_is_byte_identical_as_a_new_commit_and_restoring_the_restore_reapplies(workspace, store, git, fake):
    before = tree(workspace)
    result = dream_two_files(workspace, store, git, fake)
    after = tree(workspace)
    restore_id, restored = restore(store, git, result.run_id)
    assert tree(workspace) == before
    assert restored["files"] == ["USER.md", "memory/.dream_cursor", "memory/MEMORY.md"]
    assert any("reset memory/.dream_cursor from 5 to 0" in line for line in restored["plan"])
    subjects = git_cli(workspace, "log", "--format=%s").splitlines()
    assert subjects[0] == f"dream: restore {result.manifest['commit'][:7]}"
    assert subjects[1].startswith("dream: update") and len(subjects) == 3
    _, again = restore(store, git, restore_id)
    assert tree(workspace) == after and again["commit"] and read_dream_cursor(workspace / "memory") == 5
    assert len(git_cli(workspace, "log", "--format=%s").splitlines()) == 4


def test_a_dry_run_restore_plans_without_changing_anything(workspace, store, git, fake):
    result = dream_two_files(workspace, store, git, fake)
    head, files = git_cli(workspace, "rev-parse", "HEAD"), tree(workspace)
    plan = restore_dream(store.get_run(result.run_id), store=store, git=git, restore_run_id=None, dry_run=True)
    assert plan["commit"] is None and plan["plan"][0].startswith("revert commit")
    assert (git_cli(workspace, "rev-parse", "HEAD"), tree(workspace)) == (head, files)


def test_a_later_unrelated_edit_survives_the_restore(workspace, store, git, fake):
    result = dream_two_files(workspace, store, git, fake)
    user = workspace / "USER.md"
    user.write_text(user.read_text().replace("- Name: Ada", "- Name: Ada Lovelace"))
    (workspace / "SOUL.md").write_text(SOUL + "- Use metric units.\n")
    restore(store, git, result.run_id)
    assert user.read_text() == USER.replace("- Name: Ada", "- Name: Ada Lovelace")
    assert (workspace / "SOUL.md").read_text() == SOUL + "- Use metric units.\n"
    assert (workspace / "memory" / "MEMORY.md").read_text() == MEMORY


def test_a_conflicting_later_edit_refuses_the_restore_and_force_puts_back_the_pre_run_content(
        workspace, store, git, fake):
    result = dream_two_files(workspace, store, git, fake)
    user = workspace / "USER.md"
    user.write_text(user.read_text().replace("- Likes coffee", "- Likes coffee, black"))
    head, files = git_cli(workspace, "rev-parse", "HEAD"), tree(workspace)
    with pytest.raises(RestoreRefused) as refused:
        restore(store, git, result.run_id)
    assert refused.value.conflicts == ["USER.md"] and "--force" in str(refused.value)
    assert (git_cli(workspace, "rev-parse", "HEAD"), tree(workspace)) == (head, files)
    _, forced = restore(store, git, result.run_id, force=True)
    assert forced["forced"] and user.read_text() == USER
    assert (workspace / "memory" / "MEMORY.md").read_text() == MEMORY
    assert read_dream_cursor(workspace / "memory") == 0


def test_edits_the_agent_made_before_the_dream_survive_its_restore(workspace, store, git, fake):
    user = workspace / "USER.md"
    user.write_text(USER.replace("- Works remotely", "- Works remotely, from Lisbon"))
    before = tree(workspace)
    result = dream_two_files(workspace, store, git, fake)
    assert git_cli(workspace, "show", "--format=", "--stat", result.manifest["commit"]).count("USER.md") == 1
    assert "+- Works remotely, from Lisbon" not in git_cli(workspace, "show", result.manifest["commit"])
    restore(store, git, result.run_id)
    assert tree(workspace) == before


def test_a_nanobot_made_dream_commit_is_tolerated_listed_and_restorable_by_sha(workspace, store, git, fake):
    memory = workspace / "memory" / "MEMORY.md"
    memory.write_text(MEMORY + "- dream fact MSG-1\n")
    (workspace / "memory" / ".dream_cursor").write_text("1")
    git_cli(workspace, "add", "memory/MEMORY.md", "memory/.dream_cursor")
    subprocess.run(["git", "-c", "user.name=nanobot", "-c", "user.email=nanobot@dream", "commit", "-q", "-m",
                    "dream: manual run\n\nmemory/MEMORY.md: +1 -0"], cwd=workspace, check=True)
    nanobot_sha = git_cli(workspace, "rev-parse", "HEAD").strip()
    result = dream_two_files(workspace, store, git, fake)
    assert result.manifest["entries"] == [2, 5]
    assert asyncio.run(git.call(dream_log, git, nanobot_sha))["run_id"] is None
    assert asyncio.run(git.call(dream_log, git))["sha"] == result.manifest["commit"]
    assert asyncio.run(git.call(dream_log, git, result.run_id))["run_id"] == result.run_id
    assert asyncio.run(git.call(dream_log, git, nanobot_sha[:8]))["sha"] == nanobot_sha
    restore_id = store.create_run("restore", "ws")
    restored = restore_dream(nanobot_sha, store=store, git=git, restore_run_id=restore_id)
    assert "- dream fact MSG-1" not in memory.read_text() and "PostgreSQL 16" in memory.read_text()
    assert read_dream_cursor(workspace / "memory") == 0 and restored["commit"]


def test_restoring_an_unknown_commit_or_an_unfinished_run_is_refused(workspace, store, git):
    with pytest.raises(RestoreRefused, match="no commit"):
        restore_dream("deadbeef", store=store, git=git, restore_run_id=None, dry_run=True)
    run_id = store.create_run("dream", "ws")
    with pytest.raises(RestoreRefused, match="started"):
        restore_dream(store.get_run(run_id), store=store, git=git, restore_run_id=None, dry_run=True)


def test_restoring_a_dream_that_read_notes_makes_their_bullets_unread_again(workspace, store, git, fake):
    write_note(workspace, "2026-04-03.md", {"Decisions": ["Billing moves to PostgreSQL 16"]})
    before = tree(workspace)
    fake.push(Text("[MEMORY] billing moved to PostgreSQL 16"), EDIT_MEMORY, Text("done"))
    result = dream(workspace, store, git, fake)
    memory = workspace / "memory"
    assert unread_note_bullets(memory) == []
    plan = restore_dream(store.get_run(result.run_id), store=store, git=git, restore_run_id=None, dry_run=True)
    assert "mark 1 daily-note bullet(s) of 2026-04-03 as unread by the dream" in plan["plan"]
    assert unread_note_bullets(memory) == []
    restore_id, restored = restore(store, git, result.run_id)
    assert tree(workspace) == before and restored["notes_unread"] == result.manifest["notes_read"]
    assert [bullet.text for bullet in unread_note_bullets(memory)] == ["Billing moves to PostgreSQL 16"]
    _, again = restore(store, git, restore_id)
    assert unread_note_bullets(memory) == [] and again["notes_read"] == result.manifest["notes_read"]
    assert read_dream_cursor(memory) == 5
