"""The apply step: edits replayed onto files changed during the run, roll-back of a failed write, file backups
without git, history compaction after the commit."""

from __future__ import annotations

from pathlib import Path

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.gitstore.store import GitStore
from nanobotd.memory.history import read_dream_cursor
from tests.jobs.dream.scenario import (
    EDIT_TWO_FILES,
    FINDINGS,
    MEMORY,
    SOUL,
    USER,
    dream,
    dream_two_files,
    git_cli,
    restore,
    tree,
    write_history,
)
from tests.support.fakellm import Responder, Text
from tests.support.histories import read_history


def edit_during_the_run(path: Path, old: str, new: str) -> Responder:
    """The agent edits a file while the model is thinking about its last answer."""

    def respond(request: dict) -> Text:
        path.write_text(path.read_text().replace(old, new))
        return Text("done")

    return Responder(respond)


def test_an_edit_made_during_the_run_is_kept_and_the_dreams_edits_replayed_onto_it(workspace, store, git, fake):
    user = workspace / "USER.md"
    fake.push(Text(FINDINGS), EDIT_TWO_FILES, edit_during_the_run(user, "- Name: Ada", "- Name: Ada Lovelace"))
    result = dream(workspace, store, git, fake)
    assert result.outcome == "written"
    assert user.read_text() == USER.replace("- Name: Ada", "- Name: Ada Lovelace").replace("tea", "coffee")


def test_an_overlapping_edit_made_during_the_run_fails_the_run_without_writing(workspace, store, git, fake):
    user = workspace / "USER.md"
    fake.push(Text(FINDINGS), EDIT_TWO_FILES, edit_during_the_run(user, "- Likes tea", "- Likes green tea"))
    result = dream(workspace, store, git, fake)
    assert (result.outcome, result.manifest["cursor_after"]) == ("error", 0)
    assert "changed during the dream" in result.manifest["reason"]
    assert user.read_text() == USER.replace("- Likes tea", "- Likes green tea")
    assert (workspace / "memory" / "MEMORY.md").read_text() == MEMORY and read_dream_cursor(workspace / "memory") == 0


def test_a_failing_commit_rolls_the_written_files_back(workspace, store, git, fake):
    before = tree(workspace)
    git.lock_retry_delays = (0.01,)
    (workspace / ".git" / "index.lock").write_text("")
    result = dream_two_files(workspace, store, git, fake)
    assert (result.state, result.outcome) == ("failed", "error") and "index.lock" in result.manifest["reason"]
    assert tree(workspace) == before and (workspace / ".git" / "index.lock").exists()


def test_a_workspace_inside_another_repository_dreams_with_file_backups_only(tmp_path, store, fake):
    parent = tmp_path / "projects"
    parent.mkdir()
    git_cli(parent, "init", "-q")
    workspace = parent / "workspace"
    (workspace / "memory").mkdir(parents=True)
    for path, text in zip(MEMORY_FILES, (SOUL, USER, MEMORY), strict=True):
        (workspace / path).write_text(text)
    write_history(workspace, 5)
    before = tree(workspace)
    nested = GitStore(workspace)
    try:
        assert not nested.open() and "inside the git repository" in nested.health()["reason"]
        result = dream_two_files(workspace, store, nested, fake)
        assert result.outcome == "written" and result.manifest["commit"] is None
        assert Path(result.manifest["files_changed"]["USER.md"]["backup"]).read_text() == USER
        _, restored = restore(store, nested, result.run_id)
    finally:
        nested.close()
    assert restored["commit"] is None and tree(workspace) == before
    assert not (workspace / ".git").exists() and git_cli(parent, "status", "--porcelain").strip() == "?? workspace/"


def test_history_is_compacted_after_a_dream_and_restore_puts_the_entries_back(workspace, store, git, fake):
    fake.push(Text("[SKIP]"))
    result = dream(workspace, store, git, fake, batch_entries=3, token_budget=20, max_history_entries=1)
    assert result.manifest["stopped"] == "token budget: the next batch would not fit"
    cursors = [entry.cursor for entry in read_history(workspace / "memory").entries]
    assert cursors == [4, 5]
    compacted = result.manifest["history_compacted"]
    assert compacted["removed"] == 3 and Path(compacted["backup"]).name == "history-removed.jsonl"
    _, restored = restore(store, git, result.run_id)
    assert [entry.cursor for entry in read_history(workspace / "memory").entries] == [1, 2, 3, 4, 5]
    assert restored["history_restored"] == 3 and read_dream_cursor(workspace / "memory") == 0
