"""nanobotd/index/qmdexport.py: history and sessions as markdown for QMD, written incrementally, read back."""

from __future__ import annotations

import asyncio
import json

from nanobotd.config.schema import QmdSettings
from nanobotd.index.qmdexport import QmdExport
from nanobotd.index.sources import SourceSet
from tests.index.test_qmd import QMD_BINARY, needs_qmd
from tests.support.workspace import conversation, make_workspace, write_session


def history_line(cursor: int, content: str, key: str = "cli:direct") -> str:
    return json.dumps({"cursor": cursor, "timestamp": "2026-11-20 10:15", "content": content,
                       "session_key": key}) + "\n"


def setup(tmp_path):
    workspace, sessions = make_workspace(tmp_path)
    (workspace / "memory" / "history.jsonl").write_text(
        history_line(1, "- [durable] The boat is called Marlin.") + history_line(2, "- [durable] Tea at four."))
    messages = conversation(25)
    messages[12]["content"] = "the spare key is under the heron statue"
    write_session(sessions, "telegram:5", messages)
    write_session(sessions, "dream:1", conversation(3))
    export = QmdExport(tmp_path / "export", SourceSet(workspace, [sessions]))
    return workspace, sessions, messages, export


def exported(export: QmdExport) -> dict[str, float]:
    return {path.relative_to(export.export_dir).as_posix(): path.stat().st_mtime_ns
            for path in export.export_dir.rglob("*.md")}


def test_history_and_sessions_are_exported_in_small_files_and_dream_sessions_are_not(tmp_path):
    _, _, _, export = setup(tmp_path)
    report = export.sync()
    files = exported(export)
    assert report["sources_read"] == 3 and report["files_written"] == len(files) == 4
    assert sum(name.startswith("sessions/") for name in files) == 3  # 25 messages, 10 per file
    text = next((export.export_dir / name).read_text() for name in files if name.endswith("m000010.md"))
    assert "## #12 · 2026-11-01 09:06\n\nuser: the spare key is under the heron statue" in text


def test_a_second_sync_writes_nothing_and_an_append_rewrites_one_file(tmp_path):
    _, sessions, messages, export = setup(tmp_path)
    export.sync()
    before = exported(export)
    assert export.sync() == {"sources_read": 0, "files_written": 0, "files_removed": 0}

    messages.append({"role": "user", "content": "one more", "timestamp": "2026-11-01T10:00:00"})
    write_session(sessions, "telegram:5", messages)
    report = export.sync()

    after = exported(export)
    assert report["files_written"] == 1
    assert [name for name in after if after[name] != before.get(name)] == [f"sessions/{_stem()}/m000020.md"]


def test_a_deleted_session_takes_its_files_with_it(tmp_path):
    _, sessions, _, export = setup(tmp_path)
    export.sync()
    (sessions / f"{_stem()}.jsonl").unlink()
    assert export.sync()["files_removed"] == 3
    assert not any(name.startswith("sessions/") for name in exported(export))


def test_lines_of_an_exported_file_lead_back_to_the_session_and_its_messages(tmp_path):
    _, sessions, _, export = setup(tmp_path)
    export.sync()
    relative = f"sessions/{_stem()}/m000010.md"
    lines = (export.export_dir / relative).read_text().splitlines()
    line = next(number for number, text in enumerate(lines, 1) if "heron" in text)

    found = export.locate(relative, line, line)

    assert (found.source, found.session_key, found.first, found.last) == ("session", "telegram:5", 12, 12)
    assert found.path == str(sessions.resolve() / f"{_stem()}.jsonl") and "heron" in found.text
    entry = export.locate("history/c0000000.md", 5, 5)
    assert (entry.source, entry.first, entry.history_lines, entry.when) == ("history", 1, (1, 1), "2026-11-20 10:15")


@needs_qmd
def test_qmd_finds_session_messages_and_history_entries_by_session_key_and_location(tmp_path):
    from nanobotd.index.qmd import QmdBackend

    workspace, _, _, export = setup(tmp_path)
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "CI": "true"}

    async def scenario():
        backend = QmdBackend(workspace, tmp_path / "state", QmdSettings(command=str(QMD_BINARY), timeout_seconds=10),
                             environ=environ, export=export)
        await backend.start()
        try:
            await backend.update_now()
            return await backend.search("heron statue"), await backend.search("Marlin boat")
        finally:
            await backend.close()

    sessions_hits, history_hits = asyncio.run(scenario())
    session = sessions_hits[0]
    assert (session.source, session.session_key) == ("session", "telegram:5")
    assert session.message_start <= 12 <= session.message_end <= 13
    assert "heron" in session.text and session.backend == "qmd"
    history = history_hits[0]
    assert (history.source, history.path, history.line_start, history.session_key) == (
        "history", "memory/history.jsonl", 1, "cli:direct")


def _stem() -> str:
    from nanobotd.sessions.file import filename_for_key

    return filename_for_key("telegram:5").removesuffix(".jsonl")



def test_sessions_of_every_folder_are_exported_and_a_dropped_folder_takes_its_files_away(tmp_path):
    workspace, sessions, _, _ = setup(tmp_path)
    other = tmp_path / "other-sessions"
    other.mkdir()
    write_session(other, "slack:9", conversation(4))
    sources = SourceSet(workspace, [sessions, other])
    export = QmdExport(tmp_path / "both-export", sources)

    export.sync()
    both = exported(export)
    sources.set_sessions_dirs([sessions])
    report = export.sync()

    assert sum(name.startswith("sessions/") for name in both) == 3 + 1
    assert report["files_removed"] == 1 and len(exported(export)) == len(both) - 1



def test_an_export_made_before_memory_lookups_were_left_out_is_made_again_without_them(tmp_path):
    _, sessions, messages, export = setup(tmp_path)
    call = {"id": "c1", "type": "function", "function": {"name": "mcp_nanobotd_memory_search", "arguments": "{}"}}
    messages[3] = {"role": "assistant", "content": "Searching memory for the heron key.", "tool_calls": [call],
                   "timestamp": messages[3]["timestamp"]}
    write_session(sessions, "telegram:5", messages)
    export.sync()
    first = next(export.export_dir.rglob("m000000.md"))
    first.write_text(first.read_text() + "\nassistant: Searching memory for the heron key.\n")  # as 1 wrote it
    manifest = export.export_dir / "manifest.json"
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), version=1)))

    export.sync()

    shown = "".join(path.read_text() for path in export.export_dir.rglob("*.md"))
    assert "Searching memory" not in shown and "heron statue" in shown
