"""Beside an agent that archives by itself (companion mode), through a real daemon in auto mode.

The agent is played by the test, writing exactly what nanobot 0.3.5 writes: session files with
`last_archived`, its own history entries (with `session_key`, no nanobotd span), `/new` cutting the file
to its metadata line before the archive entry arrives.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.daemonproc import FIRST_LLM_CALL_SECONDS
from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

GRACE = 2.0
CONFIG = f"""
[consolidation]
agent_grace_seconds = {GRACE}
"""


def agent_entry(workspace, key: str, content: str) -> None:
    """Append an entry the way nanobot does (its own cursor, no nanobotd span)."""
    memory = workspace / "memory"
    cursor = max([entry["cursor"] for entry in history_entries(workspace)] + [0]) + 1
    record = {"cursor": cursor, "timestamp": time.strftime("%Y-%m-%d %H:%M"), "content": content,
              "session_key": key}
    with open(memory / "history.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    (memory / ".cursor").write_text(str(cursor))


def nanobotd_entries(workspace) -> list[dict]:
    return [entry for entry in history_entries(workspace) if "nanobotd_span" in entry]


def past_the_grace(since: float) -> None:
    """Wait until a rescue nanobotd would queue for a cut it saw by *since* is a second overdue (a wrong rescue
    shows in the run list as soon as it is queued)."""
    time.sleep(max(0.0, since + GRACE + 1.0 - time.monotonic()))


def workspace_status(daemon) -> dict:
    return daemon.ctl_json("status")["workspaces"][0]


def new_then_agent_archive_leaves_nothing_to_nanobotd(daemon, key: str, summary: str) -> None:
    """/new cuts the file first, then the agent's archive entry comes: nanobotd archives nothing, counts nothing."""
    write_session(daemon.sessions, key, [])
    daemon.wait_for(lambda: (daemon.session(key) or {}).get("vanished_messages"))  # (seen: the grace runs)
    cut_seen = time.monotonic()
    agent_entry(daemon.workspace, key, summary)
    daemon.wait_for(lambda: (daemon.session(key) or {}).get("vanished_messages") == 0, timeout=GRACE + 8)
    past_the_grace(cut_seen)
    assert nanobotd_entries(daemon.workspace) == []
    assert daemon.ctl_json("runs", "--kind", "consolidate")["runs"] == []
    assert workspace_status(daemon)["archived_twice"] == 0


@pytest.fixture
def companion(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    proc = daemon_process(workspace, extra_config=CONFIG, mode="auto")
    proc.workspace, proc.sessions = workspace, sessions
    return proc


def start_with_session(daemon, key: str, count: int) -> list[dict]:
    messages = conversation(count, tag=key[-1])
    write_session(daemon.sessions, key, messages)
    daemon.start()
    daemon.wait_for(lambda: (daemon.session(key) or {}).get("unarchived_messages") == count)
    # the agent's history is followed from before the start-up scan; an entry written before the daemon started is
    # taken as one from before nanobotd
    daemon.wait_for(lambda: workspace_status(daemon)["git"]["available"])
    assert workspace_status(daemon)["consolidation_mode"] == "companion"
    return messages


def test_auto_picks_owner_for_files_without_the_agents_mark(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    path = write_session(sessions, "cli:plain", conversation(2))
    lines = path.read_text().splitlines()
    meta = json.loads(lines[0])
    del meta["last_archived"], meta["last_consolidated"]
    path.write_text("\n".join([json.dumps(meta)] + lines[1:]) + "\n")
    daemon = daemon_process(workspace, mode="auto").start()
    daemon.wait_for(lambda: daemon.session("cli:plain"))
    assert workspace_status(daemon)["consolidation_mode"] == "owner"


def test_a_cut_session_whose_agent_entry_comes_within_the_grace_is_archived_once_by_the_agent(companion):
    start_with_session(companion, "cli:a", 6)
    new_then_agent_archive_leaves_nothing_to_nanobotd(companion, "cli:a", "- [durable] the user talked about a")


def test_a_cut_session_with_no_agent_entry_is_archived_by_nanobotd_after_the_grace(companion):
    messages = start_with_session(companion, "cli:b", 4)
    cut_at = time.monotonic()
    write_session(companion.sessions, "cli:b", [])
    companion.wait_for(lambda: nanobotd_entries(companion.workspace), timeout=GRACE + 10)
    assert time.monotonic() - cut_at >= GRACE
    text = "\n".join(entry["content"] for entry in nanobotd_entries(companion.workspace))
    assert all(message["content"].split(" ")[0] + " " in text for message in messages)
    time.sleep(1)
    assert len(companion.ctl_json("runs", "--kind", "consolidate")["runs"]) == 1
    assert workspace_status(companion)["archived_twice"] == 0


def test_what_a_cut_raw_entry_of_the_agent_dropped_is_archived_by_nanobotd(companion):
    messages = start_with_session(companion, "cli:c", 6)
    write_session(companion.sessions, "cli:c", [])
    lines = [f"[{m['timestamp'][:16]}] {m['role'].upper()}: {m['content']}" for m in messages]
    body = "[RAW] 6 messages\n" + "\n".join(lines)
    cut = body[:body.index(messages[3]["content"]) + 20] + "\n... (truncated)"
    agent_entry(companion.workspace, "cli:c", cut)
    companion.wait_for(lambda: nanobotd_entries(companion.workspace), timeout=GRACE + 10)
    mended = "\n".join(entry["content"] for entry in nanobotd_entries(companion.workspace))
    assert messages[3]["content"][20:] in mended  # the part of the fourth message the cut dropped, only
    assert messages[3]["content"][:20] not in mended
    for message in messages[4:]:
        assert message["content"] in mended
    for message in messages[:3]:
        assert message["content"] not in mended
    [run] = companion.ctl_json("runs", "--kind", "consolidate")["runs"]
    assert run["state"] == "finished"


def test_an_entry_of_a_compaction_that_never_moved_the_mark_is_not_taken_for_the_next_cuts_archive(companion):
    """nanobot writes its [RAW] fallback before it saves; when its turn then fails, the mark never moves and the entry
    belongs to no cut. A later /new archives those messages again itself (after the cut): nanobotd must not take
    the stale cut entry for that archive and mend what it seemed to drop (archiving them twice)."""
    messages = start_with_session(companion, "cli:k", 6)
    lines = [f"[{m['timestamp'][:16]}] {m['role'].upper()}: {m['content']}" for m in messages]
    body = "[RAW] 6 messages\n" + "\n".join(lines)
    agent_entry(companion.workspace, "cli:k", body[:body.index(messages[2]["content"])] + "\n... (truncated)")
    more = messages + conversation(2, tag="n")
    write_session(companion.sessions, "cli:k", more)  # the next turn's save: the mark has not moved
    companion.wait_for(lambda: (companion.session("cli:k") or {}).get("messages") == 8)
    new_then_agent_archive_leaves_nothing_to_nanobotd(companion, "cli:k", "- [durable] the user talked about k and n")


def test_an_entry_still_unclaimed_after_two_saves_counts_for_no_later_cut(companion):
    """The stale entry of a failed compaction outlives a full save: when /new later cuts the file and no archive of
    the agent follows, every cut message is rescued, not only what that old entry seemed to drop."""
    messages = start_with_session(companion, "cli:p", 6)
    lines = [f"[{m['timestamp'][:16]}] {m['role'].upper()}: {m['content']}" for m in messages]
    body = "[RAW] 6 messages\n" + "\n".join(lines)
    agent_entry(companion.workspace, "cli:p", body[:body.index(messages[2]["content"])] + "\n... (truncated)")
    for count in (8, 10):  # two turns saved, the mark never moving
        more = messages + conversation(count - 6, tag="q")
        write_session(companion.sessions, "cli:p", more)
        companion.wait_for(lambda count=count: (companion.session("cli:p") or {}).get("messages") == count)
    write_session(companion.sessions, "cli:p", [])  # /new, and its archive never comes
    companion.wait_for(lambda: nanobotd_entries(companion.workspace), timeout=GRACE + 10)
    rescued = "\n".join(entry["content"] for entry in nanobotd_entries(companion.workspace))
    assert all(message["content"] in rescued for message in more)
    [run] = companion.ctl_json("runs", "--kind", "consolidate")["runs"]
    assert workspace_status(companion)["archived_twice"] == 0


def test_the_agents_in_place_compaction_is_never_archived_again(companion):
    messages = start_with_session(companion, "cli:d", 6)
    agent_entry(companion.workspace, "cli:d", "- [durable] checkpoint of the first four messages")
    hidden = {"role": "user", "content": "Continue the active task from the working-memory checkpoint above.",
              "_hidden_history": True, "timestamp": "2026-11-01T09:10:00"}
    write_session(companion.sessions, "cli:d", messages[:4] + [hidden] + messages[4:] + conversation(2, tag="e"),
                  last_archived=4)
    companion.wait_for(lambda: (companion.session("cli:d") or {}).get("agent_archived") == 4)
    past_the_grace(time.monotonic())
    assert nanobotd_entries(companion.workspace) == []
    session = companion.session("cli:d")
    assert session["unarchived_messages"] == 4  # two old after the mark and two new; the checkpoint is not conversation
    assert workspace_status(companion)["archived_twice"] == 0


def test_a_manual_consolidate_in_companion_mode_leaves_what_is_still_in_the_file(companion):
    start_with_session(companion, "cli:f", 4)
    run = companion.ctl_json("consolidate", "cli:f", "--wait")
    assert nanobotd_entries(companion.workspace) == []
    assert companion.session("cli:f")["unarchived_messages"] == 4
    assert run


def test_archived_twice_counts_messages_the_agent_marked_after_nanobotd_archived_them(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    messages = conversation(4)
    write_session(sessions, "cli:g", messages)
    owner = daemon_process(workspace, mode="owner").start()
    owner.wait_for(lambda: owner.session("cli:g"))
    owner.ctl_json("consolidate", "cli:g", "--wait")
    write_session(sessions, "cli:g", messages + conversation(2, tag="h"), last_archived=4)
    owner.wait_for(lambda: workspace_status(owner)["archived_twice"] == 4)
    assert owner.ctl_json("observe")["archived_twice"] == {"ws": 4}
    assert "archived twice in ws: 4 message(s)" in owner.ctl("observe").stdout


def test_nanobots_own_dream_sessions_are_not_listed(companion):
    write_session(companion.sessions, "dream:20261122", conversation(2))
    start_with_session(companion, "cli:i", 2)
    keys = [row["key"] for row in companion.ctl_json("sessions")["sessions"]]
    assert keys == ["cli:i"]
    assert workspace_status(companion)["sessions_watched"] == 1


def agent_config(daemon, **defaults) -> None:
    """nanobot's config.json beside the sessions folder (<config dir>/sessions/<workspace-id>/)."""
    path = daemon.sessions.parent.parent / "config.json"
    path.write_text(json.dumps({"agents": {"defaults": defaults}}))


def llm_config(fake, consolidation: str) -> str:
    """A daemon config calling *fake* (no retries), with these [consolidation] lines."""
    return f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0

[consolidation]
{consolidation}
"""


def test_the_flush_runs_before_the_agents_budget_is_reached(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    with FakeLLM(default=Text("## Decisions\n- Backups go to the cold bucket.\n")) as fake:
        daemon = daemon_process(workspace, mode="auto", extra_config=llm_config(fake, "agent_base_tokens = 1000"))
        daemon.sessions = sessions
        agent_config(daemon, contextWindowTokens=4000, maxTokens=500, idleCompactAfterMinutes=0)
        messages = conversation(4, words=40)
        write_session(sessions, "cli:j", messages)
        daemon.start()
        daemon.wait_for(lambda: daemon.session("cli:j"))
        assert daemon.ctl_json("runs", "--kind", "flush")["runs"] == []
        for count in range(6, 60, 2):  # the tail grows turn by turn toward the agent's budget (2476 tokens)
            write_session(sessions, "cli:j", conversation(count, words=40))
            daemon.wait_for(lambda count=count: daemon.session("cli:j")["messages"] == count)
            if daemon.ctl_json("runs", "--kind", "flush")["runs"]:
                break
        tail = daemon.session("cli:j")["unarchived_tokens"]
        assert 1000 + tail < 4000 - 500 - 1024, "the flush came before the agent's own compaction would"
        flushed = daemon.wait_for(lambda: [run for run in daemon.ctl_json("runs", "--kind", "flush")["runs"]
                                           if run["state"] == "finished"], timeout=FIRST_LLM_CALL_SECONDS)
        assert flushed[0]["outcome"] == "written"
        assert "cold bucket" in (workspace / "memory").joinpath(time.strftime("%Y-%m-%d") + ".md").read_text()


def test_a_raw_entry_cut_inside_a_message_is_mended_with_only_the_part_it_dropped(companion):
    messages = start_with_session(companion, "cli:m", 6)
    write_session(companion.sessions, "cli:m", [])
    lines = [f"[{m['timestamp'][:16]}] {m['role'].upper()}: {m['content']}" for m in messages]
    body = "[RAW] 6 messages\n" + "\n".join(lines)
    cut_message = messages[3]["content"]
    held = cut_message[:60]  # the agent's cap fell 60 characters into the fourth message
    cut = body[:body.index(cut_message) + len(held)] + "\n... (truncated)"
    agent_entry(companion.workspace, "cli:m", cut)
    companion.wait_for(lambda: nanobotd_entries(companion.workspace), timeout=GRACE + 10)
    mended = "\n".join(entry["content"] for entry in nanobotd_entries(companion.workspace))
    assert cut_message[60:] in mended and "holds the first 60 characters" in mended
    assert held not in mended, "the part the agent's entry kept is archived a second time"
    assert cut_message.split(" ")[0] + " " not in mended  # its marker (M-3) is in the agent's entry only
    for message in messages[4:]:
        assert message["content"] in mended
    for message in messages[:3]:
        assert message["content"] not in mended
