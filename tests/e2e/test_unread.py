"""Long session files a real daemon finds at its first start are held unread (a copy, counters from their bytes) and
read when a job needs their messages: whatever comes in between (a SIGKILL inside the read, a kill while they are
unread and the agent's writes while the daemon is down, the agent's own archiving), every message reaches
history.jsonl once, and no held copy is left behind."""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections import Counter

from nanobotd.faults import ENV_NAME
from nanobotd.sessions.file import filename_for_key
from nanobotd.sessions.hold import HELD_DIR
from nanobotd.state.store import DB_NAME
from tests.e2e.test_companion import agent_config, agent_entry, llm_config, nanobotd_entries
from tests.support.daemonproc import FIRST_LLM_CALL_SECONDS
from tests.support.fakellm import FakeLLM, Responder, Text
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

MESSAGES = 10  # of ~8 KB each: ~80 KB a file, over HOLD_MIN_BYTES (64 KiB), so held unread
WORDS = 1000
TAGS = ("a", "b", "c")
# No LLM (raw archive entries) and a budget of ~6,000 tokens: each ~26,000-token file is over it at start, and far
# enough from it (over twice) that the start-up reconcile counts nothing exactly and leaves it unread.
OWNER_CONFIG = """
[llm]
model = "none"
context_window = 8000
max_tokens = 1000
"""
MARKER = re.compile(r"\b([A-Z])-(\d+) ")
GRACE = 2.0


def long_conversation(tag: str, count: int = MESSAGES) -> list[dict]:
    return conversation(count, words=WORDS, tag=tag)


def key_of(tag: str) -> str:
    return f"cli:{tag}"


def write_long_sessions(sessions, tags=TAGS) -> dict[str, int]:
    """One long session per tag; returns {tag: its message count}."""
    for tag in tags:
        write_session(sessions, key_of(tag), long_conversation(tag))
    return {tag: MESSAGES for tag in tags}


def state_query(daemon, sql: str) -> list[tuple]:
    """Read the daemon's state database as committed (read-only: a write in progress is not seen)."""
    connection = sqlite3.connect(f"file:{daemon.state_dir / DB_NAME}?mode=ro", uri=True, timeout=10)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def unread(daemon) -> dict[str, int]:
    return dict(state_query(daemon, "SELECT key, unread FROM sessions"))


def spooled_rows(daemon) -> int:
    return state_query(daemon, "SELECT count(*) FROM spool")[0][0]


def held_files(daemon) -> list[str]:
    folder = daemon.state_dir / HELD_DIR
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def assert_held_unread(daemon, tags) -> None:
    """Every session is held unread as committed: nothing spooled yet, its copy in held/."""
    assert unread(daemon) == {key_of(tag): 1 for tag in tags}
    assert spooled_rows(daemon) == 0
    assert len(held_files(daemon)) == len(tags)


def wait_killed(daemon) -> None:
    daemon.wait_for(lambda: daemon.proc.poll() is not None, timeout=60)
    assert daemon.proc.returncode == -9, "the armed fault point was not reached:\n" + daemon.log()[-3000:]
    del daemon.env[ENV_NAME]


def archive_all(daemon, tags) -> None:
    """Consolidate every session until nothing of it is unarchived or vanished (a budget run archives only down to
    the budget; a manual one archives the rest)."""
    def left() -> list[str]:
        sessions = {key_of(tag): daemon.session(key_of(tag)) for tag in tags}
        return [key for key, session in sessions.items()
                if session is None or session["unarchived_messages"] or session["vanished_messages"]]

    for _ in range(3):
        for key in left():
            finished = daemon.ctl("consolidate", key, "--wait", timeout=60)
            assert finished.returncode == 0, finished.stderr + daemon.log()[-3000:]
    assert left() == [], daemon.log()[-3000:]


def archived(workspace) -> Counter:
    """(tag, message number) of each marker in history.jsonl, with how many times it is there."""
    return Counter((tag.lower(), int(number)) for entry in history_entries(workspace)
                   for tag, number in MARKER.findall(entry["content"]))


def assert_archived_once(workspace, counts: dict[str, int]) -> None:
    seen = archived(workspace)
    expected = {(tag, number) for tag, count in counts.items() for number in range(count)}
    assert set(seen) == expected, f"lost: {sorted(expected - set(seen))[:10]}, unknown: {sorted(set(seen) - expected)}"
    assert {marker: times for marker, times in seen.items() if times != 1} == {}, "archived more than once"


def test_long_sessions_over_budget_at_start_are_read_once_by_their_runs_and_archived_once(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    counts = write_long_sessions(sessions)
    daemon = daemon_process(workspace, extra_config=OWNER_CONFIG)
    go = tmp_path / "go"
    daemon.env[ENV_NAME] = f"scan.read_held=hold:{go}"  # the first read of a copy waits there
    daemon.start(wait=False)  # (its API may wait on the read held there)
    daemon.wait_for(lambda: "fault point scan.read_held: holding" in daemon.log(), timeout=30)
    assert_held_unread(daemon, TAGS)  # the reconcile held them all; the first budget run reads its own
    go.touch()
    daemon.wait_ready()
    archive_all(daemon, TAGS)
    assert unread(daemon) == {key_of(tag): 0 for tag in TAGS}
    assert held_files(daemon) == [], "a held copy outlived its last unarchived message"
    assert daemon.stop() == 0
    assert_archived_once(workspace, counts)


def test_a_sigkill_inside_the_first_read_of_a_held_copy_loses_and_doubles_nothing(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    counts = write_long_sessions(sessions)
    daemon = daemon_process(workspace, extra_config=OWNER_CONFIG)
    daemon.env[ENV_NAME] = "scan.read_held=kill"  # the first budget run's read: its tail's rows written, not committed
    daemon.start(wait=False)
    wait_killed(daemon)
    assert_held_unread(daemon, TAGS)  # the read was rolled back: still unread, its copy kept
    # what the runs archived as they read stays in history, marked or for their recovery to mark
    assert state_query(daemon, "SELECT count(*) FROM archived")[0][0] <= sum(archived(workspace).values())

    daemon.start()
    archive_all(daemon, TAGS)
    assert held_files(daemon) == []
    assert daemon.stop() == 0
    assert_archived_once(workspace, counts)


def test_files_rewritten_cut_in_place_or_deleted_while_down_and_unread_lose_and_double_nothing(
        tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    tags = (*TAGS, "d")
    counts = write_long_sessions(sessions, tags)
    daemon = daemon_process(workspace, extra_config=OWNER_CONFIG)
    daemon.env[ENV_NAME] = "reconcile.startup_scanned=kill"  # held, no run started yet
    daemon.start(wait=False)
    wait_killed(daemon)
    assert_held_unread(daemon, tags)

    # the agent's next turn, saved as it saves (a new file renamed over the old one)
    counts["a"] = MESSAGES + 2
    write_session(sessions, key_of("a"), long_conversation("a", counts["a"]))
    # a cut in place: the same inode, its metadata and four messages left; the six cut are in the held copy only
    cut = sessions / filename_for_key(key_of("b"))
    inode = os.stat(cut).st_ino
    lines = cut.read_text(encoding="utf-8").splitlines()
    with open(cut, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines[:5]) + "\n")
    assert os.stat(cut).st_ino == inode
    (sessions / filename_for_key(key_of("d"))).unlink()  # and one deleted: its messages are in its copy only

    daemon.start()
    archive_all(daemon, TAGS)
    daemon.wait_for(lambda: daemon.session(key_of("d"))["vanished_messages"] == 0, timeout=30)
    assert held_files(daemon) == []
    assert daemon.stop() == 0
    assert_archived_once(workspace, counts)


def test_restoring_the_runs_that_archived_unread_sessions_brings_every_message_back_to_be_archived_once(
        tmp_path, daemon_process):
    """A user undoes every run that archived sessions held unread (one of them deleted while unread, so its messages
    were only in its copy): each message is unarchived, then archived again exactly once."""
    workspace, sessions = make_workspace(tmp_path)
    tags = (*TAGS, "d")
    counts = write_long_sessions(sessions, tags)
    daemon = daemon_process(workspace, extra_config=OWNER_CONFIG)
    daemon.env[ENV_NAME] = "reconcile.startup_scanned=kill"  # held unread, no run started yet
    daemon.start(wait=False)
    wait_killed(daemon)
    (sessions / filename_for_key(key_of("d"))).unlink()
    daemon.start()
    archive_all(daemon, TAGS)
    daemon.wait_for(lambda: daemon.session(key_of("d"))["vanished_messages"] == 0, timeout=30)
    assert_archived_once(workspace, counts)

    first_entries = {entry["cursor"] for entry in history_entries(workspace)}
    runs = [run["run_id"] for run in daemon.ctl_json("runs", "--kind", "consolidate", "--all")["runs"]]
    assert runs
    for run_id in runs:  # newest first, as a user undoes
        restored = daemon.ctl("restore", run_id, timeout=60)
        assert restored.returncode == 0, restored.stderr + daemon.log()[-3000:]
    restores = daemon.ctl_json("runs", "--kind", "restore", "--all")["runs"]
    assert len(restores) == len(runs) and {run["outcome"] for run in restores} == {"restored"}, restores
    archive_all(daemon, TAGS)  # the budget runs archive again as well
    cursors = {entry["cursor"] for entry in history_entries(workspace)}  # .cursor only grows: none is used twice
    assert first_entries.isdisjoint(cursors), "an entry outlived the run restored"
    daemon.wait_for(lambda: daemon.session(key_of("d"))["vanished_messages"] == 0, timeout=30)
    assert held_files(daemon) == []
    assert daemon.ctl_json("status")["workspaces"][0]["archived_twice"] == 0
    assert daemon.stop() == 0
    assert_archived_once(workspace, counts)


def fact_lines(markers) -> str:
    """An archive entry's fact lines, one naming each of *markers* (followed by a space, as in its message)."""
    return "\n".join(f"- [durable] saw {marker} in the transcript" for marker in markers)


def answer(request: dict) -> Text:
    """The fake model: an archive request gets one fact line per marker it was shown; a flush, a daily note."""
    if request["messages"][0]["content"].startswith("You archive"):
        seen = sorted(set(MARKER.findall(request["messages"][-1]["content"])), key=lambda m: (m[0], int(m[1])))
        return Text(fact_lines(f"{tag}-{number}" for tag, number in seen) or "(nothing)")
    return Text("## Decisions\n- Backups go to the cold bucket.\n")


def test_beside_the_agent_a_long_unread_session_is_archived_once_between_it_and_nanobotd(tmp_path, daemon_process):
    """The agent moves its mark further into a session held unread, then its tail grows to a flush, then /new cuts
    it with no archive entry of the agent: nanobotd flushes, rescues only what the agent did not archive, and
    counts nothing archived twice."""
    workspace, sessions = make_workspace(tmp_path, layout="current")
    key, first_mark, marked, count = key_of("a"), 2, 6, MESSAGES + 2  # ten unarchived: ~80 KB, held unread
    agent_entry(workspace, key, fact_lines(f"A-{number}" for number in range(first_mark)))  # before nanobotd
    write_session(sessions, key, long_conversation("a", count), last_archived=first_mark)
    with FakeLLM(default=Responder(answer)) as fake:
        daemon = daemon_process(workspace, mode="auto", extra_config=llm_config(
            fake, f"agent_grace_seconds = {GRACE}\nagent_base_tokens = 1000"))
        daemon.sessions = sessions
        # the agent's budget (~68,000 tokens) is far above the ~27,000 its prompt holds at start: nothing counted
        agent_config(daemon, contextWindowTokens=70000, maxTokens=1000, idleCompactAfterMinutes=0)
        daemon.start()
        daemon.wait_reconciled()
        daemon.wait_for(lambda: daemon.ctl_json("status")["workspaces"][0]["git"]["available"])
        assert daemon.ctl_json("status")["workspaces"][0]["consolidation_mode"] == "companion"
        assert_held_unread(daemon, ["a"])
        session = daemon.session(key)  # its counters, from its bytes: the agent's mark found
        assert (session["agent_archived"], session["unarchived_messages"]) == (first_mark, count - first_mark)

        # the agent archives four more messages itself (its entry, then the file with its mark) and goes on
        agent_entry(workspace, key, fact_lines(f"A-{number}" for number in range(first_mark, marked)))
        count += 2
        write_session(sessions, key, long_conversation("a", count), last_archived=marked)
        daemon.wait_for(lambda: (daemon.session(key) or {}).get("agent_archived") == marked)
        assert daemon.session(key)["unarchived_messages"] == count - marked
        assert unread(daemon) == {key: 0}
        while not flush_runs(daemon):  # the tail grows turn by turn to the agent's flush threshold
            assert count < MESSAGES + 24, "no flush as the agent's tail grew:\n" + daemon.log()[-3000:]
            count += 2
            write_session(sessions, key, long_conversation("a", count), last_archived=marked)
            daemon.wait_for(lambda count=count: daemon.session(key)["messages"] == count)
        flushed = daemon.wait_for(lambda: [run for run in flush_runs(daemon) if run["state"] == "finished"],
                                  timeout=FIRST_LLM_CALL_SECONDS)
        assert flushed[0]["outcome"] == "written"
        assert "cold bucket" in (workspace / "memory" / (time.strftime("%Y-%m-%d") + ".md")).read_text()

        write_session(sessions, key, [])  # /new, and no archive entry of the agent comes
        daemon.wait_for(lambda: nanobotd_entries(workspace) and daemon.session(key)["vanished_messages"] == 0,
                        timeout=GRACE + FIRST_LLM_CALL_SECONDS)
        rescued = Counter(int(number) for entry in nanobotd_entries(workspace)
                          for _, number in MARKER.findall(entry["content"]))
        assert rescued == Counter(range(marked, count)), "nanobotd archived what the agent had, or lost some"
        assert daemon.ctl_json("status")["workspaces"][0]["archived_twice"] == 0
        assert daemon.stop() == 0
    assert_archived_once(workspace, {"a": count})
    assert held_files(daemon) == []


def flush_runs(daemon) -> list[dict]:
    return daemon.ctl_json("runs", "--kind", "flush", "--all")["runs"]


def test_beside_the_agent_a_new_cutting_unread_sessions_is_archived_once_by_whoever_archives(
        tmp_path, daemon_process):
    """/new cuts two sessions still held unread: the one the agent's entry archives within the grace is not archived
    by nanobotd; the one no entry comes for is rescued from its held copy, only past the agent's mark."""
    workspace, sessions = make_workspace(tmp_path, layout="current")
    first_mark, count = 2, MESSAGES + 2
    for tag in ("a", "b"):
        agent_entry(workspace, key_of(tag), fact_lines(f"{tag.upper()}-{number}" for number in range(first_mark)))
        write_session(sessions, key_of(tag), long_conversation(tag, count), last_archived=first_mark)
    daemon = daemon_process(workspace, mode="auto", extra_config=f"""
[consolidation]
agent_grace_seconds = {GRACE}
""")
    daemon.start()
    daemon.wait_reconciled()
    daemon.wait_for(lambda: daemon.ctl_json("status")["workspaces"][0]["git"]["available"])
    assert_held_unread(daemon, ["a", "b"])

    for tag in ("a", "b"):
        write_session(sessions, key_of(tag), [])  # /new
    daemon.wait_for(lambda: all(daemon.session(key_of(tag))["vanished_messages"] for tag in ("a", "b")))
    agent_entry(workspace, key_of("a"), fact_lines(f"A-{number}" for number in range(first_mark, count)))
    daemon.wait_for(lambda: all(daemon.session(key_of(tag))["vanished_messages"] == 0 for tag in ("a", "b")),
                    timeout=GRACE + 20)
    rescued = Counter((tag.lower(), int(number)) for entry in nanobotd_entries(workspace)
                      for tag, number in MARKER.findall(entry["content"]))
    assert rescued == Counter(("b", number) for number in range(first_mark, count))
    assert daemon.ctl_json("status")["workspaces"][0]["archived_twice"] == 0
    assert daemon.stop() == 0
    assert_archived_once(workspace, {"a": count, "b": count})
    assert held_files(daemon) == []
