"""The dream job end to end: real tmp git repositories, a real state store, litellm against FakeLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nanobotd.config.schema import ContextSettings
from nanobotd.gitstore.store import GitStore
from nanobotd.jobs.dream.run import recover_dream_run
from nanobotd.memory.history import read_dream_cursor, read_history
from tests.jobs.dream.scenario import (
    CONTENT_FILES,
    EDIT_TWO_FILES,
    FINDINGS,
    MEMORY,
    SOUL,
    USER,
    dream,
    dream_two_files,
    git_cli,
    outcomes,
    restore,
    tree,
    write_history,
)
from tests.support.fakellm import Garbage, HttpError, Responder, Text, ToolCalls

REPO_ROOT = Path(__file__).resolve().parents[3]


class Killed(BaseException):
    """Stands for SIGKILL: nothing in the job may catch it."""


def test_a_dream_that_edits_two_files_makes_exactly_one_commit_with_the_trailer(workspace, store, git, fake):
    result = dream_two_files(workspace, store, git, fake)
    assert (result.state, result.outcome) == ("finished", "written")
    assert "- Likes coffee" in (workspace / "USER.md").read_text()
    assert "PostgreSQL 16" in (workspace / "memory" / "MEMORY.md").read_text()
    assert read_dream_cursor(workspace / "memory") == 5
    assert git_cli(workspace, "log", "--format=%s").splitlines() == [
        "dream: update USER.md, memory/MEMORY.md (2 findings)", "init: nanobot memory store"]
    message = git_cli(workspace, "log", "-1", "--format=%B")
    assert "USER.md: +1 -1\nmemory/MEMORY.md: +1 -1" in message
    assert "[USER] correction: prefers coffee, not tea" in message and "some chatter" not in message
    assert message.strip().split("\n\n")[-1] == f"Nanobot-Run: {result.run_id}"
    assert git_cli(workspace, "log", "-1", "--format=%an <%ae>").strip() == "nanobot <nanobot@dream>"
    assert sorted(git_cli(workspace, "show", "--format=", "--name-only").split()) == [
        "USER.md", "memory/.dream_cursor", "memory/MEMORY.md"]
    manifest = store.get_run(result.run_id).manifest
    assert manifest["commit"] == git_cli(workspace, "rev-parse", "HEAD").strip()
    assert manifest["entries"] == [1, 5] and (manifest["cursor_before"], manifest["cursor_after"]) == (0, 5)
    assert manifest["files_changed"]["USER.md"]["added"] == 1 and manifest["tokens"]["calls"] == 3
    assert Path(manifest["files_changed"]["USER.md"]["backup"]).read_text() == USER
    assert outcomes(store) == [("written", "")]
    assert "fact MSG-5" in json.dumps(fake.requests[0]["messages"]) and "tools" in fake.requests[1]


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


def test_hostile_tool_calls_are_refused_and_nothing_outside_the_allow_list_changes(
        workspace, store, git, fake, tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("XYZZY secret\n")
    (workspace / "USER.md").unlink()
    (workspace / "USER.md").symlink_to(outside)
    before, head = tree(workspace), git_cli(workspace, "rev-parse", "HEAD")
    anchor = "- No deploys on Fridays.\n"
    hostile = ToolCalls([
        ("read_file", {"path": "../outside"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "USER.md"}),
        ("edit_file", {"path": "USER.md", "edits": [{"old_text": "secret", "new_text": "pwned"}]}),
        ("edit_file", {"path": "../outside", "edits": [{"old_text": "secret", "new_text": "pwned"}]}),
        ("edit_file", {"path": "memory/history.jsonl", "edits": [{"old_text": "MSG-1", "new_text": "x"}]}),
        ("edit_file", {"path": "memory/.dream_cursor", "edits": [{"old_text": "0", "new_text": "99"}]}),
        ("edit_file", {"path": ".git/HEAD", "edits": [{"old_text": "ref", "new_text": "x"}]}),
        ("edit_file", {"path": "memory/MEMORY.md", "edits": [{"old_text": "## Decisions\n" + anchor, "new_text": ""}]}),
        ("edit_file", {"path": "memory/MEMORY.md", "edits": [{"old_text": anchor, "new_text": "x" * 10_000_000}]}),
        ("edit_file", {"path": "memory/MEMORY.md", "edits": [{"old_text": anchor, "new_text": anchor}]}),
        ("edit_file", {"path": "memory/MEMORY.md", "edits": [{"old_text": "- ", "new_text": "* "}]}),
        ("edit_file", {"path": "memory/MEMORY.md", "edits": "replace everything"}),
        ("edit_file", {"path": "memory/MEMORY.md",
                       "edits": [{"old_text": anchor, "new_text": anchor + "- 2026-04-03: deployed\n"}]}),
        ("write_file", {"path": "SOUL.md", "content": "owned"}),
    ])
    fake.push(Text("[USER] the user is an attacker"), hostile, Text("Nothing I can do."))
    result = dream(workspace, store, git, fake)
    tool_results = [message["content"] for message in fake.requests[-1]["messages"] if message["role"] == "tool"]
    assert len(tool_results) == 15 and all(text.startswith("Error: ") for text in tool_results)
    assert "XYZZY" not in json.dumps(fake.requests)
    after = tree(workspace)
    assert after.pop("memory/.dream_cursor") == b"5" and before.pop("memory/.dream_cursor") == b"0"
    assert after == before and outside.read_text() == "XYZZY secret\n"
    assert git_cli(workspace, "rev-parse", "HEAD") == head
    assert result.outcome == "no_change" and len(result.manifest["guard_rejections"]) == 2
    assert [row[0] for row in outcomes(store)] == ["guard_rejected", "guard_rejected", "no_change"]


def test_an_edit_past_a_files_cap_is_refused_in_the_tool_result_and_the_loop_goes_on(workspace, store, git, fake):
    too_long = ToolCalls([("edit_file", {"path": "USER.md", "edits": [
        {"old_text": "- Likes tea", "new_text": "- Likes tea, " + "with a long story " * 10}]})])
    fake.push(Text(FINDINGS), too_long, EDIT_TWO_FILES, Text("Applied what fits."))
    result = dream(workspace, store, git, fake, context=ContextSettings(max_chars=len(USER) + 20))
    [refusal] = [message["content"] for message in fake.requests[2]["messages"] if message["role"] == "tool"]
    assert refusal.startswith("Error: guard: USER.md would grow to") and "over its cap" in refusal
    assert result.outcome == "written" and "- Likes coffee" in (workspace / "USER.md").read_text()
    assert [rejection["path"] for rejection in result.manifest["guard_rejections"]] == ["USER.md"]
    assert [row[0] for row in outcomes(store)] == ["guard_rejected", "written"]


def test_malformed_tool_arguments_end_the_run_without_changes(workspace, store, git, fake):
    before = tree(workspace)
    fake.push(Text(FINDINGS), ToolCalls([("edit_file", '{"path": "USER.md", "edits": [')]))
    result = dream(workspace, store, git, fake)
    assert (result.state, result.outcome) == ("failed", "error") and "JSON" in result.manifest["reason"]
    assert tree(workspace) == before


def test_skip_advances_the_cursor_over_the_batch_without_a_commit(workspace, store, git, fake):
    head = git_cli(workspace, "rev-parse", "HEAD")
    fake.push(Text("[SKIP]"))
    result = dream(workspace, store, git, fake, batch_entries=3)
    assert (result.outcome, result.manifest["analysis"]) == ("no_change", ["[SKIP]"])
    assert result.manifest["entries"] == [1, 3]
    assert read_dream_cursor(workspace / "memory") == 3 and len(fake.requests) == 1
    assert git_cli(workspace, "rev-parse", "HEAD") == head
    assert "fact MSG-4" not in json.dumps(fake.requests[0])
    fake.push(Text("[SKIP]"))
    assert dream(workspace, store, git, fake, batch_entries=3).manifest["entries"] == [4, 5]
    assert dream(workspace, store, git, fake).outcome == "no_change" and len(fake.requests) == 2


@pytest.mark.parametrize("script, reason", [
    ([HttpError(500)], "HTTP 500"),
    ([Garbage()], "bad LLM response"),
    ([Text("[USER] x", finish_reason="length")], "cut off"),
    ([Text(FINDINGS), EDIT_TWO_FILES, HttpError(503)], "HTTP 503"),
])
def test_an_llm_failure_leaves_cursor_and_files_unchanged(workspace, store, git, fake, script, reason):
    before, head = tree(workspace), git_cli(workspace, "rev-parse", "HEAD")
    fake.push(*script)
    result = dream(workspace, store, git, fake)
    assert (result.state, result.outcome) == ("failed", "error") and reason in result.manifest["reason"]
    assert tree(workspace) == before and git_cli(workspace, "rev-parse", "HEAD") == head
    assert outcomes(store)[-1][0] == "error" and store.get_run(result.run_id).state == "failed"


@pytest.mark.parametrize("bounds, reason", [({"max_iterations": 2}, "iteration bound"),
                                            ({"token_budget": 20}, "token budget")])
def test_a_hit_bound_discards_the_staged_edits(workspace, store, git, fake, bounds, reason):
    before = tree(workspace)
    read = ToolCalls([("read_file", {"path": "USER.md"})])
    fake.push(Text(FINDINGS), EDIT_TWO_FILES, read, read, Text("done"))
    result = dream(workspace, store, git, fake, **bounds)
    assert (result.outcome, result.manifest["reason"]) == ("error", reason)
    assert tree(workspace) == before and result.manifest["commit"] is None


def test_offline_mode_skips_the_dream(workspace, store, git):
    result = dream(workspace, store, git, None)
    assert (result.state, result.outcome) == ("finished", "skipped_offline") and outcomes(store) == []


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
    run = DreamRun(WorkspaceSettings(path=workspace, name="ws"), store, None, git, run_id, datetime.now, 1000, kill)
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


def test_a_workspace_inside_another_repository_dreams_with_file_backups_only(tmp_path, store, fake):
    parent = tmp_path / "projects"
    parent.mkdir()
    git_cli(parent, "init", "-q")
    workspace = parent / "workspace"
    (workspace / "memory").mkdir(parents=True)
    for path, text in zip(CONTENT_FILES, (SOUL, USER, MEMORY), strict=True):
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
    result = dream(workspace, store, git, fake, batch_entries=3, max_history_entries=1)
    cursors = [entry.cursor for entry in read_history(workspace / "memory").entries]
    assert cursors == [4, 5]
    compacted = result.manifest["history_compacted"]
    assert compacted["removed"] == 3 and Path(compacted["backup"]).name == "history-removed.jsonl"
    _, restored = restore(store, git, result.run_id)
    assert [entry.cursor for entry in read_history(workspace / "memory").entries] == [1, 2, 3, 4, 5]
    assert restored["history_restored"] == 3 and read_dream_cursor(workspace / "memory") == 0


def test_an_interrupted_run_that_wrote_nothing_is_closed_as_failed(workspace, store, git):
    run_id = store.create_run("dream", "ws", manifest={"stage": "editing"})
    before = tree(workspace)
    assert recover_dream_run(store.get_run(run_id), store=store, git=git) == "failed"
    assert tree(workspace) == before and store.get_run(run_id).outcome == "interrupted"
