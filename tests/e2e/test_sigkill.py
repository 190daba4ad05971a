"""SIGKILL the daemon at every stage of a consolidation, and during a cold start and a long offline archive: nothing
is lost or doubled."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time

from nanobotd.faults import ENV_NAME
from tests.support.daemonproc import FIRST_LLM_CALL_SECONDS
from tests.support.fakellm import FakeLLM, Hang, Responder, Text
from tests.support.histories import read_history
from tests.support.observe import stat_fields
from tests.support.workspace import make_workspace, write_session

SESSIONS = 4
MARKER = re.compile(r"\bK\d+x\d+\b")
# Where each start is killed, in this order, once each: a named fault point puts the kill exactly at its step (a
# kill at a random moment lands wherever the machine's load puts it, so it took many to meet every step).
# "asked": the runs are queued or starting and the LLM is not asked yet (its worker still imports litellm);
# "in the call": a request is with the LLM; then the points a consolidation passes: its cursors journalled
# (history not written: rolled back), its entries appended (not marked: finished), its messages marked archived
# (the run not closed). Every start but the first also recovers what the kill before it interrupted.
STAGES = ("asked", "in the call", "consolidate.journalled", "consolidate.appended", "consolidate.marked")


def echo_markers(request: dict) -> Text:
    """The fake model 'summarises' by listing every marker it was shown, one fact line each."""
    text = request["messages"][-1]["content"]
    markers = sorted(set(MARKER.findall(text)), key=lambda m: tuple(map(int, m[1:].split("x"))))
    return Text("\n".join(f"- [durable] saw {marker}" for marker in markers) or "(nothing)")


def session_messages(session: int, count: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"K{session}x{i} message body {i}",
             "timestamp": f"2026-11-01T10:{i // 60:02d}:{i % 60:02d}"} for i in range(count)]


def test_sigkill_at_every_stage_of_consolidation_never_loses_or_duplicates_a_message(tmp_path, daemon_process):
    rng = random.Random(20261122)
    workspace, sessions = make_workspace(tmp_path, layout="current")
    counts = {session: 6 for session in range(SESSIONS)}
    for session in range(SESSIONS):
        write_session(sessions, f"cli:s{session}", session_messages(session, counts[session]))
    with FakeLLM(latency=0.05, default=Responder(echo_markers)) as fake:
        proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
timeout_seconds = 5
max_retries = 0
""")
        for stage in STAGES:
            if "." in stage:
                proc.env[ENV_NAME] = f"{stage}=kill"
            if stage == "in the call":
                fake.push(Hang(seconds=120))  # the first request is answered only once the daemon is gone
            proc.start()
            for session in rng.sample(range(SESSIONS), 2):
                counts[session] += rng.randint(2, 8)
                write_session(sessions, f"cli:s{session}", session_messages(session, counts[session]))
            # asked at once, before or after the daemon saw the new messages: a run archives what it has spooled
            for session in range(SESSIONS):
                proc.ctl("consolidate", f"cli:s{session}", "--no-wait")
            kill_at(proc, fake, stage)
        proc.start()
        for session in range(SESSIONS):
            finished = proc.ctl("consolidate", f"cli:s{session}", "--wait", timeout=60)
            assert finished.returncode == 0, finished.stderr + proc.log()[-3000:]
        interrupted = proc.log().count("was interrupted; recovery")
        assert proc.stop() == 0
        print(f"{len(STAGES)} kills, {interrupted} interrupted runs recovered")
    assert interrupted >= len(STAGES) - 1, "every kill from the LLM call on leaves a run started, to recover"

    assert_each_message_archived_once(workspace, counts)


def kill_at(proc, fake, stage: str) -> None:
    """The daemon dies at *stage*: killed by its armed fault point, or by the test once the stage is reached."""
    if stage == "in the call":
        proc.wait_for(lambda: fake.in_flight, timeout=FIRST_LLM_CALL_SECONDS, interval=0.01)
    if "." in stage:
        proc.wait_for(lambda: proc.proc.poll() is not None, timeout=FIRST_LLM_CALL_SECONDS, interval=0.01)
        del proc.env[ENV_NAME]
    else:
        proc.kill()
    assert proc.proc.returncode == -9, f"{stage}: " + proc.log()[-3000:]


def assert_each_message_archived_once(workspace, counts: dict[int, int]) -> None:
    scan = read_history(workspace / "memory")
    assert scan.bad_lines == []
    cursors = [entry.cursor for entry in scan.entries]
    assert cursors == sorted(set(cursors)), "cursors must be unique and increasing"
    assert int((workspace / "memory" / ".cursor").read_text()) >= cursors[-1]
    seen: dict[str, int] = {}
    for entry in scan.entries:
        for marker in MARKER.findall(entry.content):
            seen[marker] = seen.get(marker, 0) + 1
    expected = {f"K{session}x{i}" for session in range(SESSIONS) for i in range(counts[session])}
    assert set(seen) == expected, f"lost: {sorted(expected - set(seen))[:10]}"
    doubled = {marker: n for marker, n in seen.items() if n != 1}
    assert not doubled, f"archived more than once: {doubled}"
    for path in (workspace / "memory").iterdir():
        if path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line)


def test_sigkill_during_a_cold_start_loses_nothing_and_the_next_start_counts_as_one_scan_at_a_time(
        tmp_path, daemon_process):
    """A cold start of many sessions killed while it reconciles (some sessions applied, their held copies made):
    the next start ends with exactly what one scan at a time gives, every message spooled once."""
    from nanobotd.sessions.hold import HELD_DIR
    from nanobotd.sessions.tracker import SessionTracker
    from nanobotd.state.store import StateStore
    from tests.support.workspace import conversation

    workspace, sessions = make_workspace(tmp_path / "ws")
    paths = [write_session(sessions, f"cli:c{number}", conversation(240, tag=f"c{number}", words=40))
             for number in range(60)]
    proc = daemon_process(workspace, mode="companion")  # beside nanobot: cl100k, as the agent counts
    proc.start(wait=False)
    held = proc.state_dir / HELD_DIR
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(os.listdir(held) if held.is_dir() else ()) < 10:
        time.sleep(0.002)
    os.kill(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(timeout=10)

    proc.start()
    status = proc.wait_for(lambda: _reconciled(proc, len(paths)), timeout=120)
    store = StateStore(tmp_path / "reference").open()
    reference = SessionTracker("ws", store, encoding="cl100k_base")
    expected = [reference.scan(path) and reference.sessions[f"cli:c{number}"] for number, path in enumerate(paths)]
    assert status["unarchived_messages"] == sum(session.unarchived_messages for session in expected) == 60 * 240
    assert status["unarchived_tokens"] == sum(session.unarchived_tokens for session in expected)
    store.close()


def test_sigkill_during_a_long_offline_archive_loses_and_doubles_no_message(tmp_path, daemon_process):
    """A long offline archive killed once its first chunks reached history, before they were marked archived:
    after recovery and the next run every message is in history once."""
    from collections import Counter

    from tests.support.workspace import conversation

    workspace, sessions = make_workspace(tmp_path / "ws")
    messages = conversation(1000, tag="k", words=60)  # a few hundred raw chunks: killed after its first group
    write_session(sessions, "cli:long", messages)
    proc = daemon_process(workspace, extra_config="\n[llm]\nmodel = \"none\"\ncontext_window = 8000\nmax_tokens = 1000")
    proc.env[ENV_NAME] = "consolidate.appended=kill"  # once the first chunks reached history
    proc.start()
    proc.ctl("consolidate", "cli:long", "--no-wait")  # unless the budget's own run began (and died) first
    deadline = time.monotonic() + 60
    while proc.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.proc.returncode == -9, "the daemon did not die mid-run:\n" + proc.log()[-3000:]
    del proc.env[ENV_NAME]

    proc.start()
    finished = proc.ctl("consolidate", "cli:long", "--wait", timeout=120)
    assert finished.returncode == 0, finished.stderr + proc.log()[-3000:]
    assert proc.session("cli:long")["unarchived_messages"] == 0
    assert "was interrupted; recovery" in proc.log(), "killed mid-run"
    assert proc.stop() == 0
    scan = read_history(workspace / "memory")
    assert scan.bad_lines == []
    seen = Counter(int(number) for entry in scan.entries
                   for number in re.findall(r"\bK-(\d+) (?:user|assistant) says", entry.content))
    assert set(seen) == set(range(len(messages))), f"lost: {sorted(set(range(len(messages))) - set(seen))[:10]}"
    assert {number: count for number, count in seen.items() if count != 1} == {}, "archived more than once"


def _kill_and_outlive_none(proc, children: list[int], what: str) -> None:
    """SIGKILL the daemon: none of its *children* is alive soon after (their stdin closed with it)."""
    os.kill(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(child) for child in children), f"{what} outlived its daemon"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        fields = stat_fields(pid)
    except OSError:
        return False
    return fields[0] != "Z"


def _reconciled(proc, sessions: int) -> dict | None:
    answer = proc.ctl("--json", "status")
    if answer.returncode != 0:
        return None
    workspace = json.loads(answer.stdout)["workspaces"][0]
    return workspace if workspace.get("last_reconcile") and workspace.get("sessions_watched") == sessions else None
