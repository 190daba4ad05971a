"""The pre-compaction flush, against a real OpenAI-compatible server that litellm calls."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import pytest

from nanobotd import fsio
from nanobotd.config.schema import LLMSettings
from nanobotd.jobs.flush import FlushReplyError, flush_session, parse_facts, restore_flush_run, write_facts
from nanobotd.llm.client import LLMClient
from nanobotd.memory.dailynote import NoteError
from nanobotd.memory.transcript import PendingMessage
from nanobotd.state.store import StateStore
from tests.support.fakellm import FakeLLM, HttpError, Text
from tests.support.llmworker import llm_client

NOW = datetime(2026, 3, 5, 21, 30)
NOTE_NAME = "2026-03-05.md"
FIRST_REPLY = """## Topics
- Backups of the photo library

## Decisions
- Use restic for backups.
- The user prefers nightly runs

## Tool Activity
- Ran `restic init` on the NAS: repository created

## Open Questions
- Which retention policy?
"""
OVERLAPPING_REPLY = """## Topics
- backups of the photo library!

## Decisions
- use RESTIC   for backups
- Keep 30 daily snapshots

## Tool Activity

## Open Questions
- which retention policy
"""
USER_NOTE = (
    "# 2026-03-05\n\n"
    "## Topics\n- Morning stand-up\n\n"
    "## Notes\nWritten by hand; do not touch.\n- my own bullet\n\n"
)
USER_SECTION = "## Notes\nWritten by hand; do not touch.\n- my own bullet\n\n"


def client(fake: FakeLLM, **overrides) -> LLMClient:
    settings = LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5, **overrides)
    return llm_client(settings)


def conversation(count: int = 4, size: int = 20) -> list[PendingMessage]:
    messages = []
    for index in range(count):
        role = "user" if index % 2 == 0 else "assistant"
        text = f"message {index}: " + "word " * size
        record = {"role": role, "content": text, "timestamp": f"2026-03-05T10:{index % 60:02d}:00"}
        messages.append(PendingMessage(f"d{index}", role, record["timestamp"], text, size + 4, record))
    return messages


def flush(ws, store, llm, messages=None, now=NOW) -> tuple[str, dict]:
    run_id = store.create_run("flush", ws.name, session_key="telegram:1")
    manifest = asyncio.run(flush_session(ws, conversation() if messages is None else messages,
                                         session_key="telegram:1", llm=llm, store=store, run_id=run_id, now=now))
    return run_id, manifest


def outcomes(store) -> list[tuple]:
    return store.query("SELECT kind, workspace, outcome, reason FROM outcomes ORDER BY id")


def note_of(ws) -> Path:
    return ws.path / "memory" / NOTE_NAME


def test_flush_merges_facts_into_the_right_sections_of_todays_note(fake, store, ws):
    fake.push(Text(FIRST_REPLY))
    run_id, manifest = flush(ws, store, client(fake))
    assert note_of(ws).read_text() == (
        "# 2026-03-05\n\n"
        "## Topics\n- Backups of the photo library\n\n"
        "## Decisions\n- Use restic for backups.\n- The user prefers nightly runs\n\n"
        "## Tool Activity\n- Ran `restic init` on the NAS: repository created\n\n"
        "## Open Questions\n- Which retention policy?\n"
    )
    assert manifest["session"] == "telegram:1"
    assert manifest["messages"] == ["d0", "d3", 4]
    assert manifest["note"] == str(note_of(ws)) and manifest["backup"] is None
    assert manifest["added_bullets"]["Decisions"] == ["Use restic for backups.", "The user prefers nightly runs"]
    assert manifest["tokens"]["calls"] == 1 and manifest["tokens"]["prompt_tokens"] == 10
    run = store.get_run(run_id)
    assert (run.state, run.outcome) == ("finished", "written")
    assert outcomes(store) == [("flush", "main", "written", "")]
    prompt = fake.requests[0]["messages"]
    assert "NO_REPLY" in prompt[0]["content"] and "message 3: word" in prompt[1]["content"]


def test_flushing_twice_with_overlapping_facts_never_duplicates_a_bullet(fake, store, ws):
    fake.push(Text(FIRST_REPLY), Text(OVERLAPPING_REPLY))
    llm = client(fake)
    flush(ws, store, llm)
    _, manifest = flush(ws, store, llm)
    assert manifest["added_bullets"] == {"Decisions": ["Keep 30 daily snapshots"]}
    text = note_of(ws).read_text()
    assert text.lower().count("backups of the photo library") == 1
    assert text.lower().count("restic for backups") == 1
    assert text.lower().count("retention policy") == 1
    assert "- The user prefers nightly runs\n- Keep 30 daily snapshots\n" in text
    assert "Already in today's note" in fake.requests[1]["messages"][1]["content"]


def test_a_user_written_section_survives_byte_identical(fake, store, ws):
    note_of(ws).write_text(USER_NOTE)
    fake.push(Text(FIRST_REPLY))
    _, manifest = flush(ws, store, client(fake))
    text = note_of(ws).read_text()
    assert USER_SECTION in text and text.endswith(USER_SECTION)
    assert text.startswith("# 2026-03-05\n\n## Topics\n- Morning stand-up\n- Backups of the photo library\n\n")
    assert Path(manifest["backup"]).read_text() == USER_NOTE


def test_no_reply_writes_nothing(fake, store, ws):
    fake.push(Text("NO_REPLY"))
    run_id, manifest = flush(ws, store, client(fake))
    assert not note_of(ws).exists()
    assert manifest["added_bullets"] == {}
    assert store.get_run(run_id).outcome == "no_change"
    assert outcomes(store) == [("flush", "main", "no_change", "NO_REPLY")]


def test_an_llm_500_writes_nothing_and_records_an_error(fake, store, ws):
    note_of(ws).write_text(USER_NOTE)
    fake.push(HttpError(500))
    run_id, manifest = flush(ws, store, client(fake))
    assert note_of(ws).read_text() == USER_NOTE
    run = store.get_run(run_id)
    assert (run.state, run.outcome) == ("failed", "error")
    [(kind, _, outcome, reason)] = outcomes(store)
    assert (kind, outcome) == ("flush", "error") and "500" in reason
    assert manifest["tokens"]["errors"] == 1


def test_a_reply_without_bullets_writes_nothing(fake, store, ws):
    fake.push(Text("Sure! Here is what I found interesting about the chat."))
    run_id, _ = flush(ws, store, client(fake))
    assert not note_of(ws).exists()
    assert store.get_run(run_id).outcome == "error"


def test_offline_the_flush_calls_nothing_and_writes_nothing(store, ws):
    run_id, _ = flush(ws, store, LLMClient(LLMSettings()))
    assert not note_of(ws).exists()
    assert store.get_run(run_id).outcome == "no_change"


def test_the_transcript_is_capped_to_the_newest_messages_that_fit(fake, store, ws):
    fake.push(Text("NO_REPLY"))
    messages = conversation(count=60, size=100)
    _, manifest = flush(ws, store, client(fake, context_window=4000), messages)
    sent = fake.requests[0]["messages"][1]["content"]
    assert "message 59:" in sent and "message 0:" not in sent
    assert 0 < manifest["sent"] < 60
    assert f"({manifest['sent']} of 60 messages" in sent
    assert len(sent) < 4000 * 0.4 * 4


def test_a_note_that_cannot_be_written_ends_the_run_in_an_error_naming_it(fake, store, ws, tmp_path):
    (ws.path / "memory").mkdir(parents=True, exist_ok=True)
    note_of(ws).symlink_to(tmp_path / "elsewhere.md")
    fake.push(Text(FIRST_REPLY))
    run_id, manifest = flush(ws, store, client(fake))
    assert store.get_run(run_id).outcome == "error" and not (tmp_path / "elsewhere.md").exists()
    assert outcomes(store)[-1][2:] == ("error", f"note not written: {NOTE_NAME} is a symlink; left alone")


def test_restore_round_trip_is_byte_identical(fake, store, ws):
    original = USER_NOTE.encode() + "- café ☕\n".encode()
    note_of(ws).write_bytes(original)
    fake.push(Text(FIRST_REPLY))
    run_id, _ = flush(ws, store, client(fake))
    changed = note_of(ws).read_bytes()
    preview = restore_flush_run(store.get_run(run_id), dry_run=True)
    assert note_of(ws).read_bytes() == changed
    assert preview["files"] == [str(note_of(ws))] and "put back" in preview["plan"][0]
    result = restore_flush_run(store.get_run(run_id), dry_run=False)
    assert result["plan"] == preview["plan"]
    assert note_of(ws).read_bytes() == original


def test_restoring_a_flush_that_created_the_note_deletes_it(fake, store, ws):
    fake.push(Text(FIRST_REPLY))
    run_id, _ = flush(ws, store, client(fake))
    restore_flush_run(store.get_run(run_id), dry_run=False)
    assert not note_of(ws).exists()


def test_restore_after_the_note_changed_removes_only_the_runs_bullets(fake, store, ws):
    note_of(ws).write_text(USER_NOTE)
    fake.push(Text(FIRST_REPLY))
    run_id, _ = flush(ws, store, client(fake))
    with note_of(ws).open("a") as handle:
        handle.write("A line the user added later.\n")
    result = restore_flush_run(store.get_run(run_id), dry_run=False)
    assert "remove the 5 bullets" in result["plan"][0]
    assert note_of(ws).read_text() == USER_NOTE + "A line the user added later.\n"


@pytest.mark.parametrize("reply", ["NO_REPLY", "`NO_REPLY`", "<think>hmm</think>\nNO_REPLY.", "## Topics\nNO_REPLY"])
def test_parse_facts_recognises_no_reply(reply):
    assert parse_facts(reply) is None


def test_parse_facts_accepts_heading_variants_and_skips_empty_bullets():
    facts = parse_facts("### decisions:\n* Use restic\n- (none)\n**Open Questions**\n- Which NAS?\n## Chit-chat\n- hi")
    assert facts == {"Decisions": ["Use restic"], "Open Questions": ["Which NAS?"]}
    with pytest.raises(FlushReplyError):
        parse_facts("I could not find anything structured.")


@pytest.mark.parametrize("linked", ["note", "memory"])
def test_a_daily_note_symlinked_outside_the_workspace_is_never_written(tmp_path, linked):
    workspace = tmp_path / "workspace"
    outside = tmp_path / "outside"
    outside.mkdir()
    if linked == "memory":
        workspace.mkdir()
        (workspace / "memory").symlink_to(outside, target_is_directory=True)
    else:
        (workspace / "memory").mkdir(parents=True)
        (workspace / "memory" / NOTE_NAME).symlink_to(outside / NOTE_NAME)
    store = StateStore(tmp_path / "state").open()
    run_id = store.create_run("flush", "ws", session_key="cli:a")
    with pytest.raises((fsio.UnsafePath, NoteError)):
        write_facts(workspace / "memory" / NOTE_NAME, NOW.date(), {"Decisions": ["escape"]}, {},
                    store=store, run_id=run_id)
    assert list(outside.iterdir()) == []


def test_restoring_a_flush_whose_note_the_lifecycle_archived_removes_its_bullets_from_the_archive(fake, store, ws):
    """Ten days on the lifecycle has moved the note into memory/archive/; the flush is still inside its restore
    window, so restoring it undoes it there rather than saying the note is gone."""
    from datetime import timedelta

    from nanobotd.jobs.lifecycle.run import run_lifecycle

    note_of(ws).write_text(USER_NOTE)
    fake.push(Text(FIRST_REPLY))
    run_id, _ = flush(ws, store, client(fake))
    lifecycle_id = store.create_run("lifecycle", ws.name)
    asyncio.run(run_lifecycle(ws, store=store, llm=LLMClient(LLMSettings()), run_id=lifecycle_id,
                              now=NOW + timedelta(days=10)))
    archived = ws.path / "memory" / "archive" / NOTE_NAME
    assert archived.is_file() and not note_of(ws).exists()
    preview = restore_flush_run(store.get_run(run_id), dry_run=True)
    assert preview["files"] == [str(archived)], preview
    result = restore_flush_run(store.get_run(run_id), dry_run=False)
    assert result["plan"] == preview["plan"]
    assert archived.read_text() == USER_NOTE
