"""The dream's sandboxed file tools and the edit guard, on real files in a tmp workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nanobotd.config.schema import ContextSettings
from nanobotd.jobs.dream.tools import (
    ERROR_PREFIX,
    MAX_NEW_TEXT_BYTES,
    StagedFiles,
    ToolRefused,
    guard_edit,
    noisy_line_reason,
)

SOUL = "# Soul\n\n## Style\n- Be concise.\n- Answer in English.\n"
USER = "# User\n\n## Identity\n- Name: Ada\n- Lives in Berlin\n\n## Preferences\n- Likes tea\n- Uses vim\n"
MEMORY = (
    "# Memory\n\n## Project Context\n- The billing service uses MySQL 8.\n- The API is written in Go.\n\n"
    "## Decisions\n- No deploys on Fridays.\n- Code review is required for every merge.\n"
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "memory").mkdir(parents=True)
    (root / "SOUL.md").write_text(SOUL)
    (root / "USER.md").write_text(USER)
    (root / "memory" / "MEMORY.md").write_text(MEMORY)
    (root / "memory" / "history.jsonl").write_text('{"cursor": 1, "timestamp": "2026-04-03 10:00", "content": "x"}\n')
    (root / "memory" / ".dream_cursor").write_text("0")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def edit(staged: StagedFiles, path: str, *pairs: tuple[str, str]) -> str:
    return staged.run("edit_file", {"path": path, "edits": [{"old_text": old, "new_text": new} for old, new in pairs]})


def test_edits_land_in_the_staged_copy_and_never_on_disk(workspace):
    before = snapshot(workspace)
    staged = StagedFiles(workspace)
    result = edit(staged, "USER.md", ("- Likes tea", "- Likes coffee"))
    assert result.startswith("Edited USER.md")
    assert "- Likes coffee" in staged.run("read_file", {"path": "USER.md"})
    assert snapshot(workspace) == before
    assert staged.changes() == {"USER.md": (USER.encode(), USER.replace("- Likes tea", "- Likes coffee"))}


@pytest.mark.parametrize("path", ["./USER.md", "memory//MEMORY.md", "SOUL.md"])
def test_allow_listed_paths_are_accepted_in_normal_spellings(workspace, path):
    assert not StagedFiles(workspace).run("read_file", {"path": path}).startswith(ERROR_PREFIX)


@pytest.mark.parametrize("path", [
    "../outside.md", "memory/../../outside.md", "/etc/passwd", str(Path("/tmp") / "USER.md"),
    "memory/history.jsonl", "memory/.dream_cursor", ".git/config", "AGENTS.md", "", None, 42, "USER.md\0",
])
def test_paths_outside_the_allow_list_are_refused(workspace, path):
    before = snapshot(workspace)
    staged = StagedFiles(workspace)
    assert staged.run("read_file", {"path": path}).startswith(ERROR_PREFIX)
    assert edit_result(staged, path).startswith(ERROR_PREFIX)
    assert staged.changes() == {} and snapshot(workspace) == before


def edit_result(staged: StagedFiles, path: object) -> str:
    return staged.run("edit_file", {"path": path, "edits": [{"old_text": "x", "new_text": "y"}]})


def test_a_symlink_leading_outside_the_workspace_is_refused(workspace, tmp_path):
    outside = tmp_path / "outside.md"
    outside.write_text("# secret\n- token\n")
    (workspace / "USER.md").unlink()
    (workspace / "USER.md").symlink_to(outside)
    staged = StagedFiles(workspace)
    read = staged.run("read_file", {"path": "USER.md"})
    assert read.startswith(ERROR_PREFIX) and "symlink" in read and "token" not in read
    assert edit(staged, "USER.md", ("- token", "- stolen")).startswith(ERROR_PREFIX)
    assert outside.read_text() == "# secret\n- token\n"


def test_a_symlink_to_another_file_inside_the_workspace_is_refused(workspace):
    (workspace / "SOUL.md").unlink()
    (workspace / "SOUL.md").symlink_to(workspace / "memory" / "history.jsonl")
    staged = StagedFiles(workspace)
    assert staged.run("read_file", {"path": "SOUL.md"}).startswith(ERROR_PREFIX)
    assert "SOUL.md" in staged.unavailable


def test_a_symlinked_memory_folder_is_refused(workspace, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (workspace / "memory").rename(elsewhere)
    (workspace / "memory").symlink_to(elsewhere)
    staged = StagedFiles(workspace)
    assert edit(staged, "memory/MEMORY.md", ("MySQL 8", "PostgreSQL 16")).startswith(ERROR_PREFIX)


def test_a_missing_file_cannot_be_read_or_edited(workspace):
    (workspace / "SOUL.md").unlink()
    staged = StagedFiles(workspace)
    assert "does not exist" in staged.run("read_file", {"path": "SOUL.md"})
    assert "does not exist" in edit(staged, "SOUL.md", ("x", "y"))
    assert not (workspace / "SOUL.md").exists()


@pytest.mark.parametrize("edits, expected", [
    ([{"old_text": "- Likes tea", "new_text": "- Likes tea"}], "no-op"),
    ([{"old_text": "- ", "new_text": "* "}], "occurs"),
    ([{"old_text": "- Likes rum", "new_text": "- Likes gin"}], "not found"),
    ([{"old_text": "", "new_text": "x"}], "empty old_text"),
    ([], "non-empty list"),
    ("- Likes tea", "non-empty list"),
    ([["- Likes tea", "x"]], "must be an object"),
    ([{"old_text": "- Likes tea"}], "string old_text and new_text"),
    ([{"old_text": "- Likes tea", "new_text": "x" * (MAX_NEW_TEXT_BYTES + 1)}], "at most"),
])
def test_bad_edits_are_refused_with_a_message_the_model_can_act_on(workspace, edits, expected):
    staged = StagedFiles(workspace)
    result = staged.run("edit_file", {"path": "USER.md", "edits": edits})
    assert result.startswith(ERROR_PREFIX) and expected in result
    assert staged.changes() == {}


def test_a_batch_is_all_or_nothing(workspace):
    staged = StagedFiles(workspace)
    result = edit(staged, "USER.md", ("- Likes tea", "- Likes coffee"), ("- Uses emacs", "- Uses nano"))
    assert result.startswith(ERROR_PREFIX) and "edit 2" in result
    assert staged.current["USER.md"] == USER


def test_several_edits_in_one_call_apply_in_order(workspace):
    staged = StagedFiles(workspace)
    edit(staged, "USER.md", ("- Likes tea", "- Likes coffee"), ("- Likes coffee\n- Uses vim", "- Uses helix"))
    assert staged.current["USER.md"].endswith("## Preferences\n- Uses helix\n")


def test_unknown_tools_and_non_object_arguments_are_refused(workspace):
    staged = StagedFiles(workspace)
    assert "unknown tool" in staged.run("write_file", {"path": "USER.md", "content": "x"})
    assert staged.run("edit_file", ["USER.md"]).startswith(ERROR_PREFIX)


def test_the_guard_refuses_removing_a_whole_section_and_records_it(workspace):
    staged = StagedFiles(workspace)
    result = edit(staged, "memory/MEMORY.md", ("## Decisions\n- No deploys on Fridays.\n", ""))
    assert result.startswith(ERROR_PREFIX + "guard:") and "## Decisions" in result
    assert staged.rejections == [{"path": "memory/MEMORY.md", "reason": result[len(ERROR_PREFIX):]}]
    assert staged.changes() == {}


def test_the_guard_refuses_removing_most_of_a_file_in_one_edit_or_in_several(workspace):
    staged = StagedFiles(workspace)
    context = "- The billing service uses MySQL 8.\n- The API is written in Go.\n"
    decisions = "- No deploys on Fridays.\n- Code review is required for every merge.\n"
    result = edit(staged, "memory/MEMORY.md", (context, "- Go.\n"), (decisions, "- Reviews.\n"))
    assert result.startswith(ERROR_PREFIX + "guard:") and "remove" in result
    long_user = USER + "- Reads the news at 7\n- Prefers short answers\n"
    (workspace / "USER.md").write_text(long_user)
    staged = StagedFiles(workspace)
    assert edit(staged, "USER.md", ("- Lives in Berlin\n", "")).startswith("Edited")
    assert edit(staged, "USER.md", ("- Uses vim\n- Reads the news at 7\n", "")).startswith("Edited")
    third = edit(staged, "USER.md", ("- Prefers short answers\n", ""))
    assert third.startswith(ERROR_PREFIX + "guard:") and "remove" in third
    assert len(staged.rejections) == 1


def test_the_guard_keeps_corrections_and_additions(workspace):
    assert guard_edit("USER.md", USER, USER, USER.replace("- Likes tea", "- Likes coffee (not tea)")) is None
    added = MEMORY + "- Deploys go through the staging cluster.\n"
    assert guard_edit("memory/MEMORY.md", MEMORY, MEMORY, added) is None
    assert guard_edit("USER.md", USER, USER, USER + "- Birthday: 1990-12-10\n") is None


@pytest.mark.parametrize("line", [
    "- 2026-04-03: deployed the billing service",
    "- [2026-04-03 10:00] user asked about backups",
    "## 2026-04-03",
    "- **2026-04-03** release",
    "- Meeting 2026-04-03 10:00",
    "- https://example.com/some/page",
    "- <https://example.com>",
    "- [docs](https://example.com/docs)",
])
def test_memory_md_gets_no_date_stamped_or_url_only_lines(workspace, line):
    assert noisy_line_reason(line) is not None
    staged = StagedFiles(workspace)
    anchor = "- Code review is required for every merge.\n"
    result = edit(staged, "memory/MEMORY.md", (anchor, anchor + line + "\n"))
    assert result.startswith(ERROR_PREFIX + "guard:")


@pytest.mark.parametrize("line", [
    "- Release 2026-04-03 moved the API to Go 1.24 and dropped the Python client entirely",
    "- Docs live at https://example.com/docs (internal wiki)",
    "- The deadline is in April.",
])
def test_ordinary_facts_with_a_date_or_a_link_inside_are_fine(line):
    assert noisy_line_reason(line) is None


def test_replay_applies_the_runs_edits_to_a_file_changed_meanwhile(workspace):
    staged = StagedFiles(workspace)
    edit(staged, "USER.md", ("- Likes tea", "- Likes coffee"))
    changed = USER.replace("- Name: Ada", "- Name: Ada Lovelace")
    assert staged.replay("USER.md", changed) == changed.replace("- Likes tea", "- Likes coffee")
    with pytest.raises(ToolRefused):
        staged.replay("USER.md", USER.replace("- Likes tea\n", ""))


def test_read_shows_the_staged_text_and_marks_an_empty_file(workspace):
    (workspace / "SOUL.md").write_text("")
    staged = StagedFiles(workspace)
    assert staged.read("SOUL.md") == "(empty file)"
    assert os.fspath(workspace) not in staged.read("USER.md")


def test_an_edit_that_would_push_a_file_past_its_cap_is_refused_with_the_reason(workspace):
    staged = StagedFiles(workspace, ContextSettings(max_chars=len(USER) + 10, total_max_chars=10_000))
    result = edit(staged, "USER.md", ("- Uses vim\n", "- Uses vim\n- Reads the news every morning at seven\n"))
    assert result.startswith(ERROR_PREFIX + "guard: USER.md would grow to")
    assert f"over its cap of {len(USER) + 10:,} (context.max_chars)" in result and "Make room first" in result
    assert staged.rejections[0]["path"] == "USER.md" and staged.changes() == {}
    assert edit(staged, "USER.md", ("- Uses vim\n", "- Uses vim\n- Runs\n")).startswith("Edited")


def test_an_edit_that_would_push_the_three_files_past_their_joint_cap_is_refused(workspace):
    total = len(SOUL) + len(USER) + len(MEMORY)
    staged = StagedFiles(workspace, ContextSettings(max_chars=10_000, total_max_chars=total + 5))
    result = edit(staged, "SOUL.md", ("- Be concise.\n", "- Be concise and kind.\n"))
    assert result.startswith(ERROR_PREFIX + "guard:") and "joint cap" in result and "context.total_max_chars" in result
    assert staged.changes() == {}


def test_a_file_already_over_its_cap_may_still_shrink_or_keep_its_size(workspace):
    staged = StagedFiles(workspace, ContextSettings(max_chars=20, total_max_chars=30))
    assert edit(staged, "USER.md", ("- Likes tea", "- Likes rum")).startswith("Edited")
    assert edit(staged, "USER.md", ("- Likes rum\n", "")).startswith("Edited")
    assert edit(staged, "USER.md", ("- Uses vim", "- Uses vim daily")).startswith(ERROR_PREFIX + "guard:")


def test_a_condensing_pass_accepts_only_edits_that_shorten_a_file_without_losing_it(workspace):
    staged = StagedFiles(workspace, ContextSettings(max_chars=50, total_max_chars=10_000))
    staged.condensing = True
    assert edit(staged, "USER.md", ("- Name: Ada\n- Lives in Berlin\n", "- Ada, Berlin\n")).startswith("Edited")
    grow = edit(staged, "USER.md", ("- Likes tea", "- Likes green tea"))
    assert grow.startswith(ERROR_PREFIX + "guard: this is a condensing pass: an edit must make USER.md shorter")
    same = edit(staged, "USER.md", ("- Likes tea", "- Likes rum"))
    assert same.startswith(ERROR_PREFIX + "guard: this is a condensing pass")
    cut = edit(staged, "USER.md", ("- Ada, Berlin\n", ""), ("- Likes tea\n- Uses vim\n", ""))
    assert "cut USER.md to" in cut and "do not drop facts" in cut
    dropped = edit(staged, "USER.md", ("\n## Preferences\n", "\n"))
    assert "remove the whole section '## Preferences'" in dropped
    assert len(staged.rejections) == 4 and staged.current["USER.md"] == USER.replace(
        "- Name: Ada\n- Lives in Berlin\n", "- Ada, Berlin\n")


def test_condensing_may_reword_most_lines_and_later_edits_are_measured_from_its_result(workspace):
    shorter = "# Memory\n\n## Project Context\n- Billing: MySQL 8.\n- API: Go.\n\n## Decisions\n- No Friday deploys.\n"
    staged = StagedFiles(workspace)
    assert edit(staged, "memory/MEMORY.md", (MEMORY, shorter)).startswith(ERROR_PREFIX + "guard:")
    staged.condensing = True
    assert edit(staged, "memory/MEMORY.md", (MEMORY, shorter)).startswith("Edited")
    staged.condensing = False
    staged.settle()
    assert edit(staged, "memory/MEMORY.md", ("- API: Go.\n", "- API: Go 1.24.\n")).startswith("Edited")
