"""The git store against real repositories in tmp folders, checked with the real git binary."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nanobotd.gitstore.repo import GITIGNORE_LINES, GitConflict, GitStoreError, run_id_of
from nanobotd.gitstore.store import DIFF_TRUNCATED, INIT_MESSAGE, GitStore, cap_diff

USER = "# User\n\n## Identity\n- Name: Ada\n- Lives in Berlin\n- Works remotely\n\n## Preferences\n- Likes tea\n"
MEMORY = "# Memory\n\n## Project Context\n- Billing uses MySQL 8.\n"
NANOBOT_ENV = {"GIT_AUTHOR_NAME": "nanobot", "GIT_AUTHOR_EMAIL": "nanobot@dream",
               "GIT_COMMITTER_NAME": "nanobot", "GIT_COMMITTER_EMAIL": "nanobot@dream"}


def git(folder: Path, *args: str) -> str:
    env = {**os.environ, **NANOBOT_ENV}
    return subprocess.run(["git", *args], cwd=folder, env=env, check=True, capture_output=True, text=True).stdout


def make_workspace(root: Path) -> Path:
    workspace = root / "workspace"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "SOUL.md").write_text("# Soul\n\n## Style\n- Be concise.\n")
    (workspace / "USER.md").write_text(USER)
    (workspace / "memory" / "MEMORY.md").write_text(MEMORY)
    (workspace / "memory" / "history.jsonl").write_text("")
    (workspace / "AGENTS.md").write_text("# Agents\n")
    return workspace


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


@pytest.fixture
def store(workspace: Path):
    git_store = GitStore(workspace, lock_retry_delays=(0.05, 0.1, 0.2))
    assert git_store.open()
    yield git_store
    git_store.close()


def edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


def test_init_creates_a_nanobot_layout_with_one_initial_commit(store, workspace):
    assert (workspace / ".git").is_dir()
    assert (workspace / ".gitignore").read_text().splitlines() == list(GITIGNORE_LINES)
    assert git(workspace, "log", "--format=%an <%ae>|%cn <%ce>|%s").splitlines() == [
        f"nanobot <nanobot@dream>|nanobot <nanobot@dream>|{INIT_MESSAGE}"]
    assert sorted(git(workspace, "ls-files").split()) == [".gitignore", "SOUL.md", "USER.md", "memory/MEMORY.md"]
    assert store.health() == {"available": True, "reason": "", "head": git(workspace, "rev-parse", "HEAD").strip(),
                              "dirty_tracked_files": []}


def test_an_existing_gitignore_is_merged_without_duplicates(tmp_path):
    workspace = make_workspace(tmp_path)
    (workspace / ".gitignore").write_text("*.swp\n/*\n!SOUL.md")
    git_store = GitStore(workspace)
    try:
        assert git_store.open()
    finally:
        git_store.close()
    lines = (workspace / ".gitignore").read_text().splitlines()
    assert lines[:3] == ["*.swp", "/*", "!SOUL.md"]
    assert sorted(lines) == sorted(set(lines)) and set(GITIGNORE_LINES) <= set(lines)


def test_an_existing_nanobot_repository_is_used_as_it_is(workspace):
    (workspace / ".gitignore").write_text("\n".join(GITIGNORE_LINES) + "\n")
    git(workspace, "init", "-q")
    git(workspace, "add", ".gitignore", "SOUL.md", "USER.md", "memory/MEMORY.md")
    git(workspace, "commit", "-q", "-m", INIT_MESSAGE)
    head = git(workspace, "rev-parse", "HEAD")
    git_store = GitStore(workspace)
    try:
        assert git_store.open()
    finally:
        git_store.close()
    assert git(workspace, "rev-parse", "HEAD") == head
    assert (workspace / ".gitignore").read_text() == "\n".join(GITIGNORE_LINES) + "\n"


def test_a_workspace_inside_another_repository_gets_no_repository_of_its_own(tmp_path):
    parent = tmp_path / "projects"
    parent.mkdir()
    git(parent, "init", "-q")
    workspace = make_workspace(parent)
    git_store = GitStore(workspace)
    try:
        assert not git_store.open()
        health = git_store.health()
    finally:
        git_store.close()
    assert health["available"] is False
    assert health["reason"] == f"workspace is inside the git repository at {parent.resolve()}"
    assert not (workspace / ".git").exists() and not (workspace / ".gitignore").exists()
    with pytest.raises(GitStoreError):
        git_store.show()


def test_a_commit_carries_stats_notes_a_capped_diff_and_the_trailer_last(store, workspace):
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    (workspace / "memory" / ".dream_cursor").write_text("7")
    sha = store.commit(["USER.md", "memory/.dream_cursor"], "update USER.md", "r-20260403-100000-dream-abcdef",
                       notes="Analysis:\n[USER] likes coffee now")
    message = git(workspace, "log", "-1", "--format=%B", sha)
    paragraphs = message.strip().split("\n\n")
    assert paragraphs[0] == "dream: update USER.md"
    assert paragraphs[1].splitlines()[0] == "USER.md: +1 -1"
    assert "Analysis:\n[USER] likes coffee now" in message
    assert "-- Likes tea\n+- Likes coffee" in message
    assert paragraphs[-1] == "Nanobot-Run: r-20260403-100000-dream-abcdef"
    assert run_id_of(message) == "r-20260403-100000-dream-abcdef"
    assert git(workspace, "show", "--format=", "--name-only", sha).split() == ["USER.md", "memory/.dream_cursor"]
    assert store.commit(["USER.md"], "nothing", "r-x") is None


def test_cap_diff_cuts_at_a_line_and_says_so():
    diff = "\n".join(f"+line {number}" for number in range(5000))
    capped = cap_diff(diff)
    assert len(capped) <= 8000 + len(DIFF_TRUNCATED) + 1 and capped.endswith("\n" + DIFF_TRUNCATED)
    assert cap_diff("short") == "short"


def test_only_the_given_paths_are_committed_and_other_staged_work_stays_staged(store, workspace):
    (workspace / "AGENTS.md").write_text("# Agents\n- staged by the user\n")
    git(workspace, "add", "-f", "AGENTS.md")
    edit(workspace / "memory" / "MEMORY.md", "MySQL 8", "PostgreSQL 16")
    sha = store.commit(["memory/MEMORY.md"], "update memory/MEMORY.md", "r-1")
    assert git(workspace, "show", "--format=", "--name-only", sha).split() == ["memory/MEMORY.md"]
    assert git(workspace, "diff", "--cached", "--name-only").split() == ["AGENTS.md"]


def test_a_fresh_index_lock_is_waited_for_and_never_deleted(store, workspace):
    lock = workspace / ".git" / "index.lock"
    lock.write_text("")
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    with pytest.raises(GitStoreError, match="index.lock"):
        store.commit(["USER.md"], "update USER.md", "r-1")
    assert lock.exists()
    releaser = threading.Timer(0.1, lock.unlink)
    releaser.start()
    try:
        assert store.commit(["USER.md"], "update USER.md", "r-1")
    finally:
        releaser.join()


def test_a_stale_index_lock_is_removed(store, workspace):
    lock = workspace / ".git" / "index.lock"
    lock.write_text("")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    assert store.commit(["USER.md"], "update USER.md", "r-1")
    assert not lock.exists()


def test_show_reads_nanobots_own_dream_commits_next_to_ours(store, workspace):
    edit(workspace / "memory" / "MEMORY.md", "MySQL 8", "MySQL 8.4")
    (workspace / "memory" / ".dream_cursor").write_text("3")
    git(workspace, "add", "memory/MEMORY.md", "memory/.dream_cursor")
    git(workspace, "commit", "-q", "-m", "dream: manual run\n\nmemory/MEMORY.md: +1 -1")
    theirs = git(workspace, "rev-parse", "HEAD").strip()
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    ours = store.commit(["USER.md"], "update USER.md", "r-2")
    shown, manual = store.show(), store.show(theirs[:7])
    assert [entry["run_id"] for entry in (shown, manual)] == ["r-2", None]
    assert shown["sha"] == ours and manual["sha"] == theirs and manual["message"].startswith("dream: manual run")
    assert all(entry["author"] == "nanobot <nanobot@dream>" and entry["date"] for entry in (shown, manual))
    assert git(workspace, "log", "--format=%s").splitlines()[-1] == INIT_MESSAGE
    assert store.find_commit_for_run("r-2") == ours and store.find_commit_for_run("r-9") is None
    assert "+- Likes coffee" in shown["diff"]
    with pytest.raises(GitStoreError):
        store.show("0123456789abcdef")


def test_revert_undoes_one_commit_and_keeps_later_unrelated_edits(store, workspace):
    before = (workspace / "USER.md").read_bytes()
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    sha = store.commit(["USER.md"], "update USER.md", "r-1")
    edit(workspace / "USER.md", "- Name: Ada", "- Name: Ada Lovelace")
    result = store.revert(sha, "r-2")
    assert result["files"] == ["USER.md"] and result["reverted"] == sha
    assert (workspace / "USER.md").read_bytes() == before.replace(b"- Name: Ada", b"- Name: Ada Lovelace")
    subjects = git(workspace, "log", "--format=%s").splitlines()
    assert subjects[:3] == [f"dream: restore {sha[:7]}", "dream: snapshot edits made outside the dream",
                            "dream: update USER.md"]
    assert run_id_of(git(workspace, "log", "-1", "--format=%B")) == "r-2"
    assert store.health()["dirty_tracked_files"] == []


def test_a_conflicting_revert_changes_nothing(store, workspace):
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    sha = store.commit(["USER.md"], "update USER.md", "r-1")
    edit(workspace / "USER.md", "- Likes coffee", "- Likes coffee, black")
    state = (git(workspace, "rev-parse", "HEAD"), git(workspace, "status", "--porcelain"),
             (workspace / "USER.md").read_bytes(), (workspace / ".git" / "index").read_bytes())
    with pytest.raises(GitConflict) as caught:
        store.revert(sha, "r-2")
    assert caught.value.files == ["USER.md"]
    assert state == (git(workspace, "rev-parse", "HEAD"), git(workspace, "status", "--porcelain"),
                     (workspace / "USER.md").read_bytes(), (workspace / ".git" / "index").read_bytes())


def test_a_revert_whose_commit_fails_puts_the_files_back(store, workspace):
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    sha = store.commit(["USER.md"], "update USER.md", "r-1")
    (workspace / ".git" / "index.lock").write_text("")
    with pytest.raises(GitStoreError):
        store.revert(sha, "r-2")
    assert "- Likes coffee" in (workspace / "USER.md").read_text()
    assert git(workspace, "rev-parse", "HEAD").strip() == sha


def test_revert_with_an_override_and_restore_files_make_forward_commits(store, workspace):
    cursor = workspace / "memory" / ".dream_cursor"
    cursor.write_text("4")
    edit(workspace / "USER.md", "- Likes tea", "- Likes coffee")
    sha = store.commit(["USER.md", "memory/.dream_cursor"], "update USER.md", "r-1")
    assert store.revert(sha, "r-2", dry_run=True)["commit"] is None and cursor.read_text() == "4"
    store.revert(sha, "r-2", overrides={"memory/.dream_cursor": b"2"})
    assert cursor.read_text() == "2" and "- Likes tea" in (workspace / "USER.md").read_text()
    contents = {"USER.md": b"# User\n", "memory/.dream_cursor": None}
    forced = store.restore_files(contents, "restore by hand", "r-3")
    assert git(workspace, "log", "-1", "--format=%s", forced).strip() == "dream: restore by hand"
    assert not cursor.exists() and (workspace / "USER.md").read_text() == "# User\n"
    assert len(git(workspace, "log", "--format=%H").split()) == 4
    with pytest.raises(GitStoreError, match="parents"):
        store.revert(git(workspace, "rev-list", "--max-parents=0", "HEAD").strip(), "r-4")


def test_call_runs_every_operation_on_the_single_git_thread(store):
    names = asyncio.run(_thread_names(store))
    assert len(set(names)) == 1 and names[0].startswith("git")


async def _thread_names(store: GitStore) -> list[str]:
    names = await asyncio.gather(*(store.call(lambda: threading.current_thread().name) for _ in range(5)))
    assert (await store.call(store.health))["available"]
    return list(names)
