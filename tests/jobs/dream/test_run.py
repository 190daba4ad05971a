"""The dream job end to end: batches, the guard in the loop, LLM failures and bounds; real tmp git repositories,
a real state store, litellm against FakeLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanobotd.config.schema import ContextSettings
from nanobotd.jobs.dream.prompts import CONDENSE_SYSTEM
from nanobotd.memory.history import read_dream_cursor
from tests.jobs.dream.scenario import (
    EDIT_MEMORY,
    EDIT_TWO_FILES,
    EDIT_USER,
    FINDINGS,
    USER,
    dream,
    dream_two_files,
    git_cli,
    outcomes,
    prompt_of,
    tree,
    write_note,
)
from tests.support.fakellm import Garbage, HttpError, Text, ToolCalls


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


def test_skip_advances_the_cursor_over_every_batch_without_a_commit(workspace, store, git, fake):
    head = git_cli(workspace, "rev-parse", "HEAD")
    fake.push(Text("[SKIP]"), Text("[SKIP]"))
    result = dream(workspace, store, git, fake, batch_entries=3)
    assert (result.outcome, result.manifest["analysis"]) == ("no_change", ["[SKIP]"])
    assert [batch["entries"] for batch in result.manifest["batches"]] == [[1, 3], [4, 5]]
    assert result.manifest["entries"] == [1, 5] and result.manifest["left"] == {"history_entries": 0,
                                                                               "note_bullets": 0}
    assert read_dream_cursor(workspace / "memory") == 5 and len(fake.requests) == 2
    assert git_cli(workspace, "rev-parse", "HEAD") == head
    assert "fact MSG-4" not in json.dumps(fake.requests[0]) and "fact MSG-4" in json.dumps(fake.requests[1])
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


def test_new_note_bullets_reach_the_dream_prompt_once_and_only_once(workspace, store, git, fake):
    write_note(workspace, "archive/2026-03-20.md", {"Decisions": ["Staging deploys go through Argo"]})
    today = write_note(workspace, "2026-04-03.md", {"Decisions": ["Billing moves to PostgreSQL 16"],
                                                    "Topics": ["Ada asked about backups"]})
    fake.push(Text("[MEMORY] billing moved to PostgreSQL 16"), EDIT_MEMORY, Text("done"))
    result = dream(workspace, store, git, fake)
    prompt = prompt_of(fake.requests[0])
    assert "fact MSG-5" in prompt.split("## New history entries")[1].split("## New daily-note bullets")[0]
    assert prompt.split("## New daily-note bullets")[1] == (
        "\n\n[daily note 2026-03-20]\nDecisions:\n- Staging deploys go through Argo"
        "\n\n[daily note 2026-04-03]\nDecisions:\n- Billing moves to PostgreSQL 16\nTopics:\n- Ada asked about backups")
    assert {day: len(digests) for day, digests in result.manifest["notes_read"].items()} == {
        "2026-03-20": 1, "2026-04-03": 2}
    assert "Daily notes read: 2026-03-20 (1 bullet), 2026-04-03 (2 bullets)" in git_cli(workspace, "log", "-1")
    assert dream(workspace, store, git, fake).outcome == "no_change" and len(fake.requests) == 3
    today.write_text(today.read_text().replace("- Billing moves to PostgreSQL 16\n",
                                               "- billing moves to postgresql 16\n- No deploys on Sundays\n"))
    (workspace / "memory" / "archive" / today.name).write_bytes(today.read_bytes())
    today.unlink()
    fake.push(Text("[SKIP]"))
    assert dream(workspace, store, git, fake).outcome == "no_change"
    [later] = fake.requests[3:]
    new_bullets = prompt_of(later).split("## New daily-note bullets")[1]
    assert new_bullets == "\n\n[daily note 2026-04-03]\nDecisions:\n- No deploys on Sundays"


def test_a_backlog_of_three_batches_is_drained_in_one_run_and_one_commit(workspace, store, git, fake):
    write_note(workspace, "2026-04-04.md", {"Decisions": ["Billing moves to PostgreSQL 16"]})
    fake.push(Text("[SKIP]"), Text("[USER] correction: prefers coffee, not tea"), EDIT_USER, Text("done"),
              Text("[MEMORY] billing moved to PostgreSQL 16"), EDIT_MEMORY, Text("done"))
    result = dream(workspace, store, git, fake, batch_entries=2, token_budget=1000)
    assert result.outcome == "written" and "stopped" not in result.manifest
    assert [(batch["entries"], batch["note_bullets"]) for batch in result.manifest["batches"]] == [
        ([1, 2], {}), ([3, 4], {}), ([5, 5], {"2026-04-04": 1})]
    assert result.manifest["left"] == {"history_entries": 0, "note_bullets": 0}
    assert result.manifest["analysis"] == ["[USER] correction: prefers coffee, not tea",
                                           "[MEMORY] billing moved to PostgreSQL 16"]
    assert "- Likes coffee" in prompt_of(fake.requests[4]), "a batch sees the edits of the batches before it"
    assert read_dream_cursor(workspace / "memory") == 5 and len(fake.requests) == 7
    assert git_cli(workspace, "log", "--format=%s").splitlines()[0] == (
        "dream: update USER.md, memory/MEMORY.md (2 findings)")


def test_a_run_stops_before_a_batch_that_would_not_fit_the_budget_and_says_what_is_left(workspace, store, git, fake):
    write_note(workspace, "2026-04-04.md", {"Topics": ["Backups", "Photos"]})
    fake.push(Text(FINDINGS), EDIT_USER, Text("done"), Text(FINDINGS), EDIT_MEMORY, Text("done"))
    result = dream(workspace, store, git, fake, batch_entries=2, token_budget=100)
    assert (result.outcome, len(fake.requests), read_dream_cursor(workspace / "memory")) == ("written", 6, 4)
    assert result.manifest["stopped"] == "token budget: the next batch would not fit"
    assert result.manifest["left"] == {"history_entries": 1, "note_bullets": 2}
    assert outcomes(store)[-1] == ("written", "stopped early (token budget: the next batch would not fit); left:"
                                              " 1 history entries, 2 note bullets")
    assert "left: 1 history entries, 2 note bullets" in git_cli(workspace, "log", "-1")
    fake.push(Text("[SKIP]"))
    assert dream(workspace, store, git, fake).manifest["batches"][0]["note_bullets"] == {"2026-04-04": 2}


def test_a_batch_cut_by_the_budget_is_discarded_and_the_batches_before_it_stand(workspace, store, git, fake):
    fake.push(Text("[SKIP]"), Text(FINDINGS), EDIT_USER, Text("done"))
    before = (workspace / "USER.md").read_bytes()
    result = dream(workspace, store, git, fake, batch_entries=2, token_budget=40)
    assert (result.state, result.outcome, result.manifest["stopped"]) == ("finished", "no_change", "token budget")
    assert result.manifest["left"] == {"history_entries": 3, "note_bullets": 0}
    assert read_dream_cursor(workspace / "memory") == 2 and (workspace / "USER.md").read_bytes() == before
    assert result.manifest["analysis"] == ["[SKIP]"] and len(result.manifest["batches"]) == 1


def test_an_llm_failure_in_a_later_batch_keeps_the_completed_batches(workspace, store, git, fake):
    fake.push(Text(FINDINGS), EDIT_USER, Text("done"), HttpError(500))
    result = dream(workspace, store, git, fake, batch_entries=3)
    assert (result.outcome, read_dream_cursor(workspace / "memory")) == ("written", 3)
    assert "HTTP 500" in result.manifest["stopped"] and result.manifest["left"]["history_entries"] == 2
    assert "- Likes coffee" in (workspace / "USER.md").read_text()


LONG_USER = USER + "- Reads the news every morning at seven\n"


def long_user(workspace: Path) -> int:
    """USER.md with one more bullet, so that it alone goes over the caps the tests set; returns its length."""
    (workspace / "USER.md").write_text(LONG_USER)
    return len(LONG_USER)


def condense_user(new_text: str) -> ToolCalls:
    return ToolCalls([
        ("edit_file", {"path": "USER.md", "edits": [{"old_text": "- Lives in Berlin\n- Works remotely\n",
                                                     "new_text": new_text}]}),
        ("edit_file", {"path": "USER.md", "edits": [{"old_text": "- Likes tea", "new_text": "- Likes green tea"}]})])


def test_a_file_over_its_cap_gets_a_condensing_pass_before_the_batches(workspace, store, git, fake):
    size = long_user(workspace)
    fake.push(condense_user("- Berlin, remote\n"), Text("Condensed."), Text(FINDINGS), EDIT_TWO_FILES, Text("done"))
    result = dream(workspace, store, git, fake, context=ContextSettings(max_chars=size - 10))
    first = fake.requests[0]
    assert first["messages"][0]["content"] == CONDENSE_SYSTEM
    assert f"## Over their caps\n\n- USER.md is {size:,} characters, over its cap of {size - 10:,}" in prompt_of(first)
    refusals = [message["content"] for message in fake.requests[1]["messages"] if message["role"] == "tool"]
    assert refusals[1].startswith("Error: guard: this is a condensing pass: an edit must make USER.md shorter")
    assert (workspace / "USER.md").read_text() == LONG_USER.replace("- Lives in Berlin\n- Works remotely\n",
                                                                    "- Berlin, remote\n").replace("tea", "coffee")
    condensed = result.manifest["condensed"]
    assert (condensed["outcome"], condensed["before"]["USER.md"], condensed["after"]["USER.md"]) == (
        "within caps", size, size - 18)
    assert git_cli(workspace, "log", "-1", "--format=%s").strip() == (
        "dream: update USER.md, memory/MEMORY.md (2 findings, condensed)")
    assert f"Condensed (over the caps): USER.md {size} -> {size - 18} characters" in git_cli(
        workspace, "log", "-1")


def test_a_condensing_pass_runs_without_a_backlog_and_says_when_a_file_is_still_over(workspace, store, git, fake):
    (workspace / "memory" / ".dream_cursor").write_text("5")
    size = long_user(workspace)
    fake.push(condense_user("- Berlin\n- Remote\n"), Text("Shortened what I could."))
    result = dream(workspace, store, git, fake, context=ContextSettings(max_chars=size - 30))
    assert (result.outcome, result.manifest["condensed"]["outcome"]) == ("written", "still over")
    assert result.manifest["batches"] == [] and read_dream_cursor(workspace / "memory") == 5
    assert git_cli(workspace, "log", "-1", "--format=%s").strip() == "dream: update USER.md (0 findings, condensed)"


def test_a_failed_condensing_pass_with_nothing_else_to_do_fails_the_run_unchanged(workspace, store, git, fake):
    (workspace / "memory" / ".dream_cursor").write_text("5")
    size = long_user(workspace)
    before = tree(workspace)
    fake.push(condense_user("- Berlin, remote\n"), HttpError(500))
    result = dream(workspace, store, git, fake, context=ContextSettings(max_chars=size - 10))
    assert (result.state, result.outcome) == ("failed", "error") and "condensing pass:" in result.manifest["reason"]
    assert result.manifest["condensed"]["outcome"] == "discarded" and tree(workspace) == before


def test_a_condensing_pass_that_spends_the_budget_is_kept_and_the_batches_wait(workspace, store, git, fake):
    size = long_user(workspace)
    fake.push(condense_user("- Berlin, remote\n"), Text("Condensed."))
    result = dream(workspace, store, git, fake, token_budget=30, context=ContextSettings(max_chars=size - 10))
    condensed = result.manifest["condensed"]["outcome"]
    assert (result.outcome, condensed, len(fake.requests)) == ("written", "within caps", 2)
    assert result.manifest["stopped"] == "token budget"
    assert result.manifest["left"] == {"history_entries": 5, "note_bullets": 0}
    assert read_dream_cursor(workspace / "memory") == 0 and "- Berlin, remote" in (workspace / "USER.md").read_text()
