"""Expired notes into history: one LLM summary, or [RAW] entries that drop nothing when offline or failing."""

from __future__ import annotations

from nanobotd.config.schema import LLMSettings
from nanobotd.jobs.lifecycle.summary import note_batches, summary_entries
from nanobotd.memory import history
from tests.jobs.lifecycle.scenario import (
    lifecycle,
    standard_workspace,
    workspace,
    write_note,
)
from tests.support.fakellm import FakeLLM, HttpError, Responder, Text
from tests.support.histories import read_history
from tests.support.llmworker import llm_client


def test_offline_expired_notes_go_to_history_raw_and_whole(tmp_path, store):
    ws = standard_workspace(tmp_path)
    _, manifest = lifecycle(ws, store)
    entries = read_history(ws.path / "memory").entries
    added = [entry for entry in entries if entry.cursor in manifest["history_added"]]
    assert len(added) == 1 and added[0].content.startswith("[RAW] 2 messages\n")
    assert "[2026-03-16] NOTE: memory/archive/2026-03-16.md\n# 2026-03-16" in added[0].content
    assert "hand-written ✓" in added[0].content and "worked on project 2026-01-10" in added[0].content


def test_a_huge_expired_note_is_split_over_several_raw_entries_and_nothing_is_dropped(tmp_path, store):
    ws = workspace(tmp_path)
    facts = "".join(f"- fact-{number:05d} about the garden\n" for number in range(5000))
    write_note(ws, "archive/2026-01-01.md", facts)
    _, manifest = lifecycle(ws, store)
    entries = read_history(ws.path / "memory").entries
    assert len(entries) == len(manifest["history_added"]) > 5
    assert all(len(entry.content) <= ws.consolidation.raw_max_chars for entry in entries)
    joined = "".join(entry.content for entry in entries)
    assert all(f"fact-{number:05d}" in joined for number in range(5000))


def test_expired_notes_are_summarised_into_one_history_entry_by_the_llm(tmp_path, store):
    ws = standard_workspace(tmp_path)
    with FakeLLM() as fake:
        fake.push(Responder(lambda request: Text("- [durable] The project started in January.\n"
                                                 "- [ephemeral] Worked on it in March.",
                                                 prompt_tokens=120, completion_tokens=30)))
        llm = llm_client(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
        run_id, manifest = lifecycle(ws, store, llm)
    sent = fake.requests[0]["messages"][1]["content"]
    assert "=== memory/archive/2026-01-10.md ===" in sent and "=== memory/archive/2026-03-16.md ===" in sent
    [cursor] = manifest["history_added"]
    [entry] = [entry for entry in read_history(ws.path / "memory").entries if entry.cursor == cursor]
    assert entry.content == ("Archived daily notes 2026-01-10 to 2026-03-16 (2 notes), summarised before deletion:\n"
                             "- [durable] The project started in January.\n- [ephemeral] Worked on it in March.")
    assert entry.timestamp == "2026-06-15 04:45"
    assert store.get_run(run_id).outcome == "written"
    [(outcome, tokens, latency)] = store.query("SELECT outcome, tokens, latency_ms FROM outcomes")
    assert (outcome, tokens) == ("written", 150) and latency > 0


def test_an_llm_failure_falls_back_to_raw_entries(tmp_path, store):
    ws = standard_workspace(tmp_path)
    with FakeLLM() as fake:
        fake.push(HttpError(500))
        llm = llm_client(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
        run_id, manifest = lifecycle(ws, store, llm)
    [cursor] = manifest["history_added"]
    [entry] = [entry for entry in read_history(ws.path / "memory").entries if entry.cursor == cursor]
    assert entry.content.startswith("[RAW] 2 messages")
    [(outcome, reason)] = store.query("SELECT outcome, reason FROM outcomes")
    assert outcome == "raw_fallback" and "500" in reason


def test_summary_entries_never_exceed_the_hard_cap():
    facts = "\n".join(f"- [durable] fact {number} " + "x" * 200 for number in range(1000))
    entries = summary_entries([("memory/archive/2026-01-01.md", "")], facts)
    assert len(entries) > 1 and all(len(entry) <= history.ENTRY_HARD_CAP for entry in entries)
    assert all(f"- [durable] fact {number} " in "".join(entries) for number in range(1000))


def test_a_note_too_big_to_summarise_keeps_its_place_among_the_notes_around_it():
    notes = [("memory/2026-01-01.md", "- small one"), ("memory/2026-01-02.md", "- small two"),
             ("memory/2026-01-03.md", "- word" * 400), ("memory/2026-01-04.md", "- small four")]
    batches = note_batches(notes, 200, "cl100k_base")
    assert [path for batch, _ in batches for path, _ in batch] == [path for path, _ in notes]
    assert [fits for _, fits in batches] == [True, False, True]
