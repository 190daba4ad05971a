"""The builtin FTS5 index on real workspaces in tmp dirs: freshness, locations, hostile input, recovery."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import datetime

import pytest

from nanobotd.index.builtin import BuiltinIndex
from nanobotd.index.sessionunits import session_units
from tests.support.mounts import tmpfs
from tests.support.workspace import conversation, make_workspace, write_session

HOSTILE_QUERIES = [
    "", " ", '"', '""', "'", "(", ")", "()", "*", "-", "^", ":", "NEAR", "NEAR(a b)", "a NEAR/2 b",
    "AND", "OR", "NOT", "a AND", "OR b", "NOT NOT", '"unterminated', "kestrel*", "-kestrel", "+kestrel",
    "col:kestrel", "body : kestrel", "dates:2023", "{body dates}: x", "kestrel OR", "a\x00b", "\\", "%_",
    "日本語のテキスト", "emoji 🎉🎉", "Ω≈ç√∫", "🙂" * 500, "word " * 5000, "x" * 100_000, "';DROP TABLE units;--",
    "\u202e\u200b\ufeff", "null\x00byte", "tab\tnew\nline", "2023-02-30", "31 February 2023", "last blursday",
]


@pytest.fixture
def workspace(tmp_path):
    workspace, sessions = make_workspace(tmp_path)
    return workspace, sessions


@pytest.fixture
def index(tmp_path, workspace):
    root, sessions = workspace
    built = BuiltinIndex(root, tmp_path / "state" / "index.db", sessions, clock=lambda: datetime(2026, 11, 22, 12, 0))
    yield built
    built.close()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_fact_written_to_memory_is_found_after_refresh(index, workspace):
    root, _ = workspace
    index.refresh()
    assert index.search("zanzibar") == []
    memory = root / "memory" / "MEMORY.md"
    write(memory, memory.read_text() + "\n## Travel\n- The offsite is in Zanzibar in March.\n")

    report = index.refresh()

    assert report["files_reindexed"] == 1 and report["units_added"] == 1 and report["units_removed"] == 0
    hits = index.search("where is the offsite?")
    assert hits[0].source == "memory" and hits[0].path == "memory/MEMORY.md"
    assert (hits[0].line_start, hits[0].line_end) == (6, 7)
    assert "Zanzibar" in hits[0].text and "Zanzibar" in hits[0].snippet
    assert hits[0].when.startswith(datetime.fromtimestamp(memory.stat().st_mtime).strftime("%Y-%m-%d"))


def test_a_word_searched_before_it_was_written_is_found_once_written(index, workspace):
    """The agent looks a fact up, finds nothing, writes it into a section of MEMORY.md (the index's unit count stays
    the same) and looks again: the word counted absent the first time must not stay absent."""
    root, _ = workspace
    memory = root / "memory" / "MEMORY.md"
    write(memory, "# Memory\n\n## Travel\n- Nothing planned yet.\n\n## Servers\n- Staging is kestrel.\n")
    index.refresh()
    assert index.search("zanzibar trip") == []

    write(memory, "# Memory\n\n## Travel\n- The zanzibar trip starts on 9 March.\n\n"
                  "## Servers\n- Staging is kestrel.\n")
    report = index.refresh()

    assert report["units_added"] == report["units_removed"] == 1
    hits = index.search("zanzibar trip")
    assert hits and "zanzibar trip starts" in hits[0].text


def test_a_deleted_section_disappears_and_the_others_stay(index, workspace):
    root, _ = workspace
    memory = root / "memory" / "MEMORY.md"
    write(memory, "# Memory\n\n## Pets\n- The cat is Luna.\n\n## Servers\n- Staging is kestrel.\n")
    index.refresh()
    assert index.search("Luna")

    write(memory, "# Memory\n\n## Servers\n- Staging is kestrel.\n")
    report = index.refresh()

    assert index.search("Luna") == []
    assert report["units_removed"] == 2 and report["units_added"] == 1  # the kept section moved up
    assert index.search("kestrel staging")[0].line_start == 3


def test_a_new_session_message_is_found_and_only_new_windows_are_added(index, workspace):
    _, sessions = workspace
    index.refresh()
    messages = conversation(400)
    path = write_session(sessions, "telegram:42", messages)
    first = index.refresh()
    assert first["units_added"] == len(list(session_units(path, "telegram:42", set())))

    messages.append({"role": "user", "content": "The wifi password is periwinkle-77",
                     "timestamp": "2026-11-02T10:00:00"})
    write_session(sessions, "telegram:42", messages)
    report = index.refresh()

    assert report["files_reindexed"] == 1
    assert 1 <= report["units_added"] <= 2 and report["units_removed"] <= 1
    hit = index.search("wifi password")[0]
    assert hit.source == "session" and hit.session_key == "telegram:42"
    assert hit.message_end == 400 and hit.message_start <= 400
    assert hit.path == path.relative_to(index.workspace).as_posix()
    assert hit.when.startswith("2026-11-0")


def test_a_search_while_a_refresh_holds_the_index_answers_from_what_is_committed(index, workspace):
    root, _ = workspace
    write(root / "memory" / "MEMORY.md", "# Memory\n\n## Pets\n- The cat is Luna.\n")
    index.refresh()
    held, done = threading.Event(), threading.Event()

    def refreshing():
        with index._lock:  # what a long refresh (a first build of 100k entries) holds for seconds
            held.set()
            done.wait(30)

    thread = threading.Thread(target=refreshing)
    thread.start()
    held.wait(5)
    try:
        hits = index.search("what is the cat called")
    finally:
        done.set()
        thread.join()
    assert hits and "Luna" in hits[0].text


def test_an_unchanged_workspace_is_not_read_again(index):
    index.refresh()
    report = index.refresh()
    assert report["files_checked"] >= 3 and report["files_reindexed"] == 0 and report["units_added"] == 0


def test_every_hit_carries_its_location_and_when(index, workspace):
    root, sessions = workspace
    write(root / "memory" / "2026-11-20.md", "# 2026-11-20\n\n## Decisions\n- Chose quokka as the codename.\n")
    write(root / "memory" / "archive" / "2026-08-01.md", "## Topics\n- Quokka sightings in Perth.\n")
    history = [{"cursor": 1, "timestamp": "2026-11-21 08:15", "content": "- [durable] quokka codename agreed",
                "session_key": "cli:direct"}]
    write(root / "memory" / "history.jsonl", "".join(json.dumps(entry) + "\n" for entry in history))
    write(root / "USER.md", "# User\n\n## Likes\n- Loves quokka plushies.\n")
    write_session(sessions, "cli:direct", [{"role": "user", "content": "call the project quokka",
                                            "timestamp": "2026-11-21T08:00:00"}])
    index.refresh()

    hits = {hit.source + ":" + hit.path: hit for hit in index.search("quokka", limit=20)}

    note = hits["note:memory/2026-11-20.md"]
    assert (note.line_start, note.line_end, note.when) == (3, 4, "2026-11-20")
    assert hits["note:memory/archive/2026-08-01.md"].when == "2026-08-01"
    entry = hits["history:memory/history.jsonl"]
    assert (entry.line_start, entry.line_end, entry.when, entry.session_key) == (
        1, 1, "2026-11-21T08:15:00", "cli:direct")
    assert hits["memory:USER.md"].line_start == 3
    session = next(hit for hit in hits.values() if hit.source == "session")
    assert (session.session_key, session.message_start, session.message_end) == ("cli:direct", 0, 0)
    assert session.when == "2026-11-21T08:00:00"
    for hit in hits.values():
        assert hit.snippet and hit.when and hit.score > 0 and hit.backend == "builtin"


@pytest.mark.parametrize("query", HOSTILE_QUERIES)
def test_hostile_queries_never_raise(index, query):
    index.refresh()
    hits = index.search(query)
    assert isinstance(hits, list)


def test_fts_operators_in_a_query_are_searched_as_words(index, workspace):
    root, _ = workspace
    write(root / "memory" / "MEMORY.md", "# Memory\n\n## Notes\n- Use NEAR mode and NOT the fallback.\n")
    index.refresh()
    assert index.search('NEAR "mode" (NOT)')[0].path == "memory/MEMORY.md"


def test_a_corrupt_index_database_is_rebuilt(tmp_path, workspace):
    root, sessions = workspace
    db_path = tmp_path / "state" / "index.db"
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not a database" * 200)

    index = BuiltinIndex(root, db_path, sessions)
    index.refresh()

    assert index.search("kestrel")[0].path == "memory/MEMORY.md"
    index.close()


@pytest.mark.parametrize("damage_at", [0.0, 0.5])
def test_an_index_damaged_while_closed_is_rebuilt(tmp_path, workspace, damage_at):
    root, sessions = workspace
    write_session(sessions, "cli:long", conversation(300))
    db_path = tmp_path / "state" / "index.db"
    index = BuiltinIndex(root, db_path, sessions)
    index.refresh()
    index.close()
    size = db_path.stat().st_size
    with open(db_path, "r+b") as handle:
        handle.seek(int(size * damage_at))
        handle.write(b"\x00\xff" * (size // 4))

    reopened = BuiltinIndex(root, db_path, sessions)

    assert reopened.search("kestrel")[0].path == "memory/MEMORY.md"
    assert reopened.search("M-250")[0].session_key == "cli:long"
    assert reopened.stats()["units"] > 100
    reopened.close()


def test_an_index_that_cannot_be_made_on_a_full_disk_is_made_once_there_is_room(tmp_path, workspace):
    """A full disk is no damage: the index is neither given up nor deleted, and the first refresh after the disk has
    room fills it (before, opening raised from the constructor, and a daemon starting on a full disk stopped)."""
    root, sessions = workspace
    with tmpfs(tmp_path / "disk", "2m") as disk:
        filler = disk / "filler"
        with pytest.raises(OSError), open(filler, "wb") as handle:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()

        index = BuiltinIndex(root, disk / "index.db", sessions)
        with pytest.raises(sqlite3.OperationalError, match="full"):
            index.refresh()
        assert index.stale_files()  # each reconcile asks again while the index cannot be read
        filler.unlink()

        index.refresh()
        assert index.search("kestrel")[0].path == "memory/MEMORY.md"
        index.close()


def test_non_utf8_files_are_read_with_replacement(index, workspace):
    root, sessions = workspace
    (root / "memory" / "MEMORY.md").write_bytes(b"# Memory\n\n## Bytes\n- caf\xe9 \xff\xfe marzipan\n")
    path = sessions / "bGVnYWN5.jsonl"
    path.write_bytes(b'{"_type": "metadata", "key": "cli:bytes"}\n'
                     b'{"role": "user", "content": "nougat \xc3\x28 here", "timestamp": "2026-11-01T10:00:00"}\n'
                     b"\x00\x01garbage line\n")
    index.refresh()
    assert index.search("marzipan")[0].path == "memory/MEMORY.md"
    assert index.search("nougat")[0].source == "session"


def test_commands_checkpoints_tools_and_dream_sessions_are_not_indexed(index, workspace):
    _, sessions = workspace
    stamp = "2026-11-01T10:00:00"
    write_session(sessions, "cli:x", [
        {"role": "user", "content": "/status aardvark", "timestamp": stamp, "_command": True},
        {"role": "user", "content": "Continue the active task from the working-memory checkpoint above. aardvark",
         "timestamp": stamp, "_hidden_history": True},
        {"role": "tool", "content": "aardvark tool output", "timestamp": stamp, "tool_call_id": "1"},
        {"role": "user", "content": "hello there", "timestamp": stamp},
    ])
    write_session(sessions, "dream:20261122", [{"role": "user", "content": "aardvark dream", "timestamp": stamp}])
    index.refresh()
    assert index.search("aardvark") == []
    assert index.search("hello")[0].message_start == 3


def test_overlapping_windows_never_show_a_message_twice(index, workspace):
    _, sessions = workspace
    messages = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"pelican fact number {n}",
                 "timestamp": f"2026-11-01T10:{n:02d}:00"} for n in range(12)]
    write_session(sessions, "cli:birds", messages)
    index.refresh()

    hits = index.search("pelican", limit=20)

    shown = [position for hit in hits for position in range(hit.message_start, hit.message_end + 1)]
    assert sorted(shown) == list(range(12))
    for hit in hits:
        assert hit.text.count("pelican") == hit.message_end - hit.message_start + 1


def test_a_checkpoint_inserted_mid_file_shifts_the_windows_after_it(index, workspace):
    _, sessions = workspace
    messages = conversation(20)
    write_session(sessions, "cli:shift", messages)
    index.refresh()
    messages.insert(10, {"role": "user", "content": "Continue the active task.", "_hidden_history": True,
                         "timestamp": "2026-11-01T09:05:00"})
    messages.append({"role": "user", "content": "tapioca", "timestamp": "2026-11-01T09:30:00"})
    write_session(sessions, "cli:shift", messages)
    index.refresh()

    assert index.search("M-19")[0].message_end >= 20
    assert index.search("tapioca")[0].message_end == 21
    assert index.search("M-3")[0].message_start <= 3


def test_refresh_of_named_paths_reads_only_those(index, workspace):
    root, _ = workspace
    index.refresh()
    write(root / "USER.md", "# User\n\n## Preferences\n- Likes rooibos.\n")
    write(root / "SOUL.md", "# Soul\n\n## Style\n- Speak like a pirate.\n")

    report = index.refresh([root / "USER.md"])

    assert report["files_checked"] == 1 and report["files_reindexed"] == 1
    assert index.search("rooibos") and not index.search("pirate")


def test_a_deleted_file_disappears_whether_named_or_found_missing(index, workspace):
    root, sessions = workspace
    note = root / "memory" / "2026-11-01.md"
    write(note, "## Topics\n- wombat migration\n")
    session = write_session(sessions, "cli:gone",
                            [{"role": "user", "content": "wombat", "timestamp": "2026-11-01T10:00:00"}])
    index.refresh()
    assert len(index.search("wombat")) == 2

    note.unlink()
    assert index.refresh([note])["units_removed"] == 1
    session.unlink()
    index.refresh()

    assert index.search("wombat") == []


def test_a_date_in_the_query_finds_that_days_units(index, workspace):
    root, _ = workspace
    for day in range(1, 29):
        write(root / "memory" / f"2026-02-{day:02d}.md", f"## Topics\n- standup notes for day {day}\n")
    index.refresh()
    assert index.search("standup on 14 February 2026")[0].path == "memory/2026-02-14.md"
    assert index.search("what was the standup on 2026-02-03?")[0].path == "memory/2026-02-03.md"


def test_a_relative_date_is_resolved_with_the_clock(index, workspace):
    root, _ = workspace
    for day in range(15, 22):
        write(root / "memory" / f"2026-11-{day:02d}.md", f"## Topics\n- standup notes {day}\n")
    index.refresh()
    assert index.search("standup yesterday")[0].path == "memory/2026-11-21.md"


def test_a_legacy_session_file_takes_its_key_from_the_metadata(index, workspace):
    _, sessions = workspace
    lines = [json.dumps({"_type": "metadata", "key": "telegram:123456"}),
             json.dumps({"role": "user", "content": "ocelot", "timestamp": "2026-11-01T10:00:00"})]
    write(sessions / "telegram_123456.jsonl", "\n".join(lines) + "\n")
    index.refresh()
    assert index.search("ocelot")[0].session_key == "telegram:123456"


def test_rebuild_and_stats(index, workspace):
    index.refresh()
    before = index.stats()
    report = index.rebuild()
    after = index.stats()
    assert report["units_added"] == before["units"] == after["units"] > 0
    assert after["files"] == 3 and after["db_bytes"] > 0 and after["last_refresh"] == "2026-11-22T12:00:00"


def test_a_huge_memory_file_is_cut_into_small_units(index, workspace):
    root, _ = workspace
    (root / "memory" / "MEMORY.md").write_text("## Blob\n" + "lorem ipsum " * 400_000 + "capybara\n")
    index.refresh()
    hit = index.search("capybara")[0]
    assert hit.line_start == hit.line_end == 2 and len(hit.text) <= 1500


def test_on_a_large_index_common_words_give_way_to_rare_ones(tmp_path, workspace):
    root, sessions = workspace
    lines = "".join(f"## Item {n}\n- ordinary gadget report {n}\n\n" for n in range(40))
    write(root / "memory" / "MEMORY.md", "# Memory\n\n" + lines + "## Odd\n- ordinary gadget with a kumquat\n")
    index = BuiltinIndex(root, tmp_path / "small-budget.db", sessions, match_budget=10)
    index.refresh()

    assert "kumquat" in index.search("ordinary gadget kumquat")[0].text
    everywhere = index.search("ordinary gadget", limit=5)
    assert len(everywhere) == 5 and all("gadget" in hit.text for hit in everywhere)
    index.close()


def test_other_window_sizes_rebuild_the_session_windows(tmp_path, workspace):
    root, sessions = workspace
    write_session(sessions, "cli:w", conversation(10))
    first = BuiltinIndex(root, tmp_path / "w.db", sessions)
    first.refresh()
    first.close()
    second = BuiltinIndex(root, tmp_path / "w.db", sessions, window=200, stride=100)
    report = second.refresh()
    hit = second.search("M-5")[0]
    assert report["units_added"] == 3 + 9 and hit.message_end - hit.message_start <= 1
    second.close()


def test_sessions_in_every_folder_are_indexed_and_a_dropped_folder_is_forgotten(tmp_path, workspace):
    root, legacy = workspace
    current = tmp_path / "config" / "sessions" / "93b919bdf3574fe472f4373d44fb8233"
    current.mkdir(parents=True)
    write_session(legacy, "cli:old", [{"role": "user", "content": "the old layout mentions axolotl",
                                       "timestamp": "2026-11-01T10:00:00"}])
    write_session(current, "telegram:7", [{"role": "user", "content": "the new layout mentions axolotl",
                                           "timestamp": "2026-11-02T10:00:00"}])
    index = BuiltinIndex(root, tmp_path / "both.db", [current, legacy])
    index.refresh()
    assert {hit.session_key for hit in index.search("axolotl")} == {"cli:old", "telegram:7"}

    index.set_sessions_dirs([current])

    assert [hit.session_key for hit in index.search("axolotl")] == ["telegram:7"]
    index.close()


def test_a_query_naming_only_a_time_returns_that_time_and_nothing_else(index, workspace):
    root, _ = workspace
    for day in (20, 21):
        write(root / "memory" / f"2026-11-{day:02d}.md", f"## Topics\n- yesterday we said many things {day}\n")
    index.refresh()
    hits = index.search("what did we discuss yesterday?")
    assert [hit.path for hit in hits] == ["memory/2026-11-21.md"]


def test_scores_are_between_zero_and_one_and_rank_fuller_matches_higher(index, workspace):
    root, _ = workspace
    sections = "".join(f"## Item {n}\n- a gadget report number {n}\n\n" for n in range(20))
    write(root / "memory" / "MEMORY.md", "# Memory\n\n" + sections + "## Odd\n- the gadget with a kumquat\n")
    index.refresh()
    hits = index.search("kumquat gadget", limit=5)
    assert "kumquat" in hits[0].text
    assert all(0 < hit.score <= 1 for hit in hits)
    assert hits[0].score > 0.9 and hits[1].score < 0.5 * hits[0].score


def test_min_score_leaves_out_weak_hits(index, workspace):
    root, _ = workspace
    sections = "".join(f"## Item {n}\n- a gadget report number {n}\n\n" for n in range(20))
    write(root / "memory" / "MEMORY.md", "# Memory\n\n" + sections + "## Odd\n- the gadget with a kumquat\n")
    index.refresh()
    assert len(index.search("kumquat gadget", limit=10)) == 10
    strong = index.search("kumquat gadget", limit=10, min_score=0.5)
    assert len(strong) == 1 and "kumquat" in strong[0].text


def test_a_date_is_searched_by_its_day_key_not_by_the_words_every_unit_of_the_year_holds(tmp_path, workspace):
    root, sessions = workspace
    # Every entry says "2026" and "march": a phrase search would read both posting lists in full.
    history = "".join(json.dumps({"cursor": n, "timestamp": f"2026-03-{1 + n % 28:02d} 10:00",
                                  "content": f"- march 2026 budget line {n}"}) + "\n" for n in range(1, 200))
    write(root / "memory" / "history.jsonl", history)
    index = BuiltinIndex(root, tmp_path / "dates.db", sessions, match_budget=50)
    index.refresh()
    stored = index._conn().execute("SELECT dates FROM units_fts WHERE units_fts MATCH 'dates : d20260314'").fetchall()

    hits = index.search("budget on 14 March 2026", limit=20)

    assert stored and all(dates.endswith("d20260314 m202603") for dates, in stored)
    assert {hit.when[:10] for hit in hits} == {"2026-03-14"} and len(hits) == len(stored)
    index.close()


def test_a_large_refresh_leaves_no_large_wal_behind(tmp_path, workspace):
    root, sessions = workspace
    write(root / "memory" / "history.jsonl", "".join(
        json.dumps({"cursor": n, "timestamp": "2026-03-01 10:00", "content": f"- entry {n} " + "padding " * 60})
        + "\n" for n in range(1, 30_000)))
    db_path = tmp_path / "wal.db"
    index = BuiltinIndex(root, db_path, sessions)
    index.refresh()
    wal = db_path.with_name("wal.db-wal")
    assert not wal.exists() or wal.stat().st_size <= 8 * 1024 * 1024
    assert index.stats()["db_bytes"] < 1.2 * db_path.stat().st_size
    assert index.search("entry 29999")[0].line_start == 29_999
    index.close()


def test_a_hit_in_long_turns_shows_the_matching_message_cut_around_its_match(index, workspace):
    _, sessions = workspace
    filler = " ".join(f"filler{n}" for n in range(180))
    messages = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"Long turn {n}: {filler}",
                 "timestamp": f"2026-11-20T10:0{n}:00"} for n in range(4)]
    messages[2]["content"] = f"{filler} The play I attended was a production of The Crucible. {filler}"
    write_session(sessions, "cli:long", messages)
    index.refresh()

    hit = index.search("which play did I attend, the crucible?")[0]

    assert (hit.message_start, hit.message_end) == (2, 2)
    assert "production of The Crucible" in hit.text and len(hit.text.split()) <= 150  # 1.5 shares of 100
    assert hit.text.startswith("user: … filler") and hit.text.endswith(" …")


def test_the_agents_memory_lookups_are_not_indexed_but_its_other_tool_calls_words_are(index, workspace):
    _, sessions = workspace
    lookup = {"id": "c1", "type": "function", "function": {"name": "mcp_nanobotd_memory_recall", "arguments": "{}"}}
    shell = {"id": "c2", "type": "function", "function": {"name": "exec", "arguments": "{}"}}
    write_session(sessions, "cli:tools", [
        {"role": "assistant", "content": "Recalling the osprey notes.", "tool_calls": [lookup]},
        {"role": "tool", "tool_call_id": "c1", "name": "mcp_nanobotd_memory_recall", "content": "osprey nothing"},
        {"role": "assistant", "content": "Listing the osprey folder.", "tool_calls": [lookup, shell]},
    ])
    index.refresh()

    assert [hit.text for hit in index.search("osprey")] == ["assistant: Listing the osprey folder."]


def test_a_day_a_message_names_is_found_by_that_date_as_well_as_by_its_own(index, workspace):
    root, sessions = workspace
    write_session(sessions, "cli:plans", [
        {"role": "user", "content": "Book the ferry: we sail to Pemba on the 10th of February.",
         "timestamp": "2026-01-28T10:00:00"},
        {"role": "assistant", "content": "Noted, and the visa office visit is next Friday.",
         "timestamp": "2026-01-28T10:00:30"},
        {"role": "user", "content": "The lease ends 31.12.2026, remind me.", "timestamp": "2026-01-28T10:01:00"},
    ])
    for day, text in (("2026-02-11", "The band played until the small hours last night."),
                      ("2026-02-16", "We hiked up the ridge to the old lighthouse last weekend.")):  # a Monday
        write_session(sessions, f"cli:diary-{day}", [{"role": "user", "content": text, "timestamp": f"{day}T09:00:00"}])
    write(root / "memory" / "2026-03-02.md", "## Log\n- Gym was closed yesterday.\n")
    index.refresh()

    def found(query: str) -> str:
        return "\n".join(hit.text for hit in index.search(query))

    assert "sail to Pemba" in found("where do we go on 10 February 2026?")
    assert "visa office" in found("what is on Friday 30 January 2026")
    assert "lease ends" in found("what happens on 2026-12-31")
    assert "sail to Pemba" in found("where are we going on the 10th of February?")  # nearest 10 Feb to now
    assert "Gym was closed" in found("gym on 1 March 2026")
    assert "sail to Pemba" in found("January 28 2026 ferry")  # the message's own day still counts
    assert "band played" in found("what did we do on 10 February 2026?")  # told the next morning
    assert "hiked up the ridge" in found("where did we go on Saturday 14 February 2026?")


def test_a_question_naming_only_a_speaker_scores_that_speakers_messages(index, workspace):
    root, sessions = workspace
    write_session(sessions, "telegram:9", [
        {"role": "user", "name": "Caroline", "content": "I finally joined the pottery class downtown.",
         "timestamp": "2026-11-02T10:00:00"},
        {"role": "assistant", "content": "That sounds like a lovely way to spend evenings.",
         "timestamp": "2026-11-02T10:01:00"}])
    index.refresh()

    hits = index.search("What did Caroline say?")

    assert hits and "pottery" in hits[0].text and hits[0].score > 0.0
    assert index.search("What did Caroline say?", min_score=0.1)
