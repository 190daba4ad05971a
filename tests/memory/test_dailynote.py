"""Daily notes: lossless parsing, bullet merging without duplicates, and validation of note files."""

from __future__ import annotations

import os
from datetime import date

import pytest

from nanobotd.memory.dailynote import (
    NoteError,
    check_note_file,
    drop_empty_sections,
    merge_bullets,
    new_note,
    normalise_bullet,
    note_bullets,
    note_date,
    parse_note,
    remove_bullets,
    scan_notes,
)

USER_NOTE = (
    "# 2026-03-05\n"
    "\n"
    "Some prose the user wrote.\n"
    "\n"
    "## Topics\n"
    "- Backups of the photo library\n"
    "\n"
    "## Notes\n"
    "Free text, *kept* as is.\n"
    "- a user bullet\n"
    "```\n"
    "## not a heading inside a fence\n"
    "```\n"
)


@pytest.mark.parametrize("text", [
    USER_NOTE,
    "",
    "no trailing newline\n## Topics\n- a",
    "# t\r\n\r\n## Topics\r\n- crlf bullet\r\n",
    "## Topics\n\n\n- spaced\n\n\n## Decisions\n",
])
def test_parse_then_render_gives_back_every_byte(text):
    assert parse_note(text).render() == text


def test_a_heading_inside_a_code_fence_does_not_start_a_section():
    note = parse_note(USER_NOTE)
    assert [section.name for section in note.sections] == ["Topics", "Notes"]


@pytest.mark.parametrize("variant", [
    "backups of the photo library", "- Backups of the photo library.", "  BACKUPS   of the photo library!",
    "* Backups of the photo library;",
])
def test_merge_never_duplicates_a_bullet_that_differs_only_in_case_spacing_or_punctuation(variant):
    note = parse_note(USER_NOTE)
    assert merge_bullets(note, "Topics", [variant]) == []
    assert note.render() == USER_NOTE


def test_merge_adds_new_bullets_after_the_last_one_and_leaves_other_sections_alone():
    note = parse_note(USER_NOTE)
    added = merge_bullets(note, "Topics", ["New topic", "new topic.", "Backups of the photo library"])
    assert added == ["New topic"]
    text = note.render()
    assert "## Topics\n- Backups of the photo library\n- New topic\n\n## Notes\n" in text
    assert text.endswith(USER_NOTE[USER_NOTE.index("## Notes"):])


def test_missing_sections_are_created_in_the_standard_order_before_user_sections():
    note = parse_note(USER_NOTE)
    merge_bullets(note, "Open Questions", ["Which NAS?"])
    merge_bullets(note, "Decisions", ["Use restic"])
    text = note.render()
    assert text.index("## Topics") < text.index("## Decisions") < text.index("## Open Questions") < text.index(
        "## Notes")
    assert text.endswith(USER_NOTE[USER_NOTE.index("## Notes"):])
    assert "## Decisions\n- Use restic\n\n## Open Questions\n- Which NAS?\n\n## Notes" in text


def test_a_new_note_renders_title_and_sections_with_blank_lines_between():
    note = new_note(date(2026, 3, 5))
    merge_bullets(note, "Decisions", ["Use restic"])
    merge_bullets(note, "Topics", ["Backups"])
    assert note.render() == "# 2026-03-05\n\n## Topics\n- Backups\n\n## Decisions\n- Use restic\n"


def test_merging_into_a_last_line_without_newline_keeps_lines_apart():
    note = parse_note("# t\n\n## Topics\n- first")
    merge_bullets(note, "Topics", ["second"])
    assert note.render() == "# t\n\n## Topics\n- first\n- second\n"


def test_remove_bullets_undoes_a_merge_and_drops_sections_it_created():
    note = parse_note(USER_NOTE)
    merge_bullets(note, "Topics", ["New topic"])
    merge_bullets(note, "Decisions", ["Use restic"])
    remove_bullets(note, "Topics", ["New topic"])
    remove_bullets(note, "Decisions", ["Use restic"])
    drop_empty_sections(note, ["Decisions"])
    assert note.render() == USER_NOTE


def test_normalise_bullet_ignores_marker_case_whitespace_and_trailing_punctuation():
    assert normalise_bullet("-  Use   SQLite.") == normalise_bullet("use sqlite") == "use sqlite"


def test_note_date_comes_from_the_file_name():
    assert note_date("2026-03-05.md") == date(2026, 3, 5)
    with pytest.raises(NoteError, match="impossible date"):
        note_date("2026-02-30.md")
    with pytest.raises(NoteError, match="not a daily note"):
        note_date("2026-03-05-draft.md")


def test_check_note_file_rejects_non_utf8_and_notes_without_sections(tmp_path):
    good = tmp_path / "2026-03-05.md"
    good.write_text("# 2026-03-05\n\n## Topics\n- x\n")
    assert check_note_file(good).day == date(2026, 3, 5)
    latin = tmp_path / "2026-03-06.md"
    latin.write_bytes(b"## Topics\n- caf\xe9\n")
    with pytest.raises(NoteError, match="not valid UTF-8"):
        check_note_file(latin)
    bare = tmp_path / "2026-03-07.md"
    bare.write_text("# 2026-03-07\n\njust prose\n")
    with pytest.raises(NoteError, match="no ## sections"):
        check_note_file(bare)


def test_scan_notes_sorts_notes_and_reports_what_it_leaves_alone(tmp_path):
    memory = tmp_path / "memory"
    (memory / "archive").mkdir(parents=True)
    (memory / "2026-03-05.md").write_text("## Topics\n- a\n")
    (memory / "2026-02-30.md").write_text("## Topics\n- a\n")
    (memory / "MEMORY.md").write_text("# Memory\n")
    (memory / "archive" / "2026-01-05.md").write_text("## Topics\n- b\n")
    (memory / "archive" / "readme.txt").write_text("hello\n")
    scan = scan_notes(memory)
    assert [note.path.name for note in scan.active] == ["2026-03-05.md"]
    assert [note.path.name for note in scan.archived] == ["2026-01-05.md"]
    reasons = {item["path"]: item["reason"] for item in scan.skipped}
    assert set(reasons) == {"memory/2026-02-30.md", "memory/archive/readme.txt"}
    assert "impossible date" in reasons["memory/2026-02-30.md"]


def test_scan_notes_refuses_an_archive_folder_that_is_a_symlink(tmp_path):
    memory = tmp_path / "memory"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    memory.mkdir()
    (elsewhere / "2020-01-01.md").write_text("## Topics\n- old\n")
    os.symlink(elsewhere, memory / "archive")
    scan = scan_notes(memory)
    assert scan.archived == [] and not scan.archive_usable
    assert scan.skipped == [{"path": "memory/archive", "reason": "archive folder is a symlink"}]


def test_note_bullets_come_from_active_and_archived_notes_oldest_day_first(tmp_path):
    memory = tmp_path / "memory"
    (memory / "archive").mkdir(parents=True)
    (memory / "2026-06-02.md").write_text("# 2026-06-02\n\nprose\n- not in a section\n\n## Decisions\n- Use Go\n-\n")
    archived = "## Topics\n- Backups\n  - a nested line\n## Open Questions\n- Why?\n"
    (memory / "archive" / "2026-05-30.md").write_text(archived)
    (memory / "2026-06-03.md").write_text("no sections at all\n- skipped\n")
    bullets = note_bullets(memory)
    assert [(bullet.day.isoformat(), bullet.section, bullet.text) for bullet in bullets] == [
        ("2026-05-30", "Topics", "Backups"), ("2026-05-30", "Open Questions", "Why?"),
        ("2026-06-02", "Decisions", "Use Go")]


def test_a_bullet_digest_ignores_case_spacing_and_moves_but_not_rewording(tmp_path):
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "2026-06-02.md").write_text("## Decisions\n- Use Go.\n## Topics\n-   use  GO\n- Use Rust\n")
    first, moved, reworded = note_bullets(memory)
    assert first.digest == moved.digest != reworded.digest and len(first.digest) == 16
