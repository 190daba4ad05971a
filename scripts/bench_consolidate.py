#!/usr/bin/env python3
"""Consolidation benchmarks: raw-archiving throughput of one big session, offline and through a real daemon.

(The burst of sessions crossing the budget at once is scripts/bench_burst.py.)

1. Offline (raw) consolidation of a 100,000-message session through the real code path, in a fresh child
   process (so its VmHWM is its own): SessionTracker.scan (with a counting process, as the daemon's), then
   consolidate.consolidate_session(..., reason="manual") with an offline LLMClient. Prints messages/s, peak RSS
   (and the counting process's), the history entries written, and checks that every message's marker reached
   history.jsonl exactly once.
2. The session of part 1 through a real daemon (offline, consolidation mode owner): from the process start
   through its first scan, then `nanobotctl consolidate KEY` (the real command, waiting for its run) again
   until the daemon reports nothing unarchived. Prints messages/s from the start and from the first
   consolidate, the daemon's peak RSS (VmHWM), and checks every marker reached history.jsonl exactly once.
3. A session of that size through a real daemon (default settings), saved by the agent in ways that are not
   appends: a checkpoint inserted mid-file (every held row moves to the new version), then /new (every row is
   copied out of the held version, and the rescue archives them). Prints the daemon's peak RSS (VmHWM) after
   each scan and after the rescue.
4. The floor of raw archiving, for scale: the least work archiving the session of part 1 takes in one pass in
   this process (each line read and decoded once, its digest, a [RAW] line, history appended and synced a group
   at a time, one archive mark a message committed to SQLite a group at a time; no spool, no run journal, no
   backups, nothing to undo it by). Prints its messages/s and each step's seconds.

    scripts/bench_consolidate.py [--quick] [--only PARTS] [--messages N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_content import nanobot_conversation  # noqa: E402
from bench_daemon import (  # noqa: E402
    BenchDaemon,
    TreePeak,
    children_hwm_mb,
    cpu_seconds,
    memory_mb,
    save_figures,
)

from nanobotd.config.schema import LLMSettings  # noqa: E402
from nanobotd.sessions import file as sessionfile  # noqa: E402
from tests.support.daemonproc import CTL  # noqa: E402
from tests.support.workspace import history_entries, make_workspace, write_session  # noqa: E402

MARKER = re.compile(r"\bMSG-c(\d+)-(\d+)\b")
DAEMON_CONSOLIDATE_ROUNDS = 20
STOP_SECONDS = 300.0
DRAIN_TIMEOUT_SECONDS = 900.0
PARTS = ("offline", "daemon", "rewrite", "floor")
FLOOR_GROUP = 6000  # messages a history append and a marks commit


@dataclass(frozen=True)
class Sizes:
    """How big each part runs."""

    offline_messages: int


FULL = Sizes(100_000)
QUICK = Sizes(10_000)


def markers_in(text: str) -> list[tuple[int, int]]:
    """(session number, message index) of every marker in *text*."""
    return [(int(session), int(index)) for session, index in MARKER.findall(text)]


# -- 1: offline consolidation ---------------------------------------------------------------------------
def offline_worker(workspace: str, sessions: str, state_dir: str, key: str, reply) -> None:
    """In a fresh process: scan the session, then archive all of it raw; send back timings and VmHWM."""
    from nanobotd.config.schema import WorkspaceSettings
    from nanobotd.jobs.consolidate import archive as consolidate
    from nanobotd.jobs.env import JobEnv
    from nanobotd.llm.client import LLMClient
    from nanobotd.sessions.tracker import SessionTracker
    from nanobotd.state.store import StateStore

    settings = WorkspaceSettings(path=Path(workspace), name="ws", sessions_dir=Path(sessions),
                                 llm=LLMSettings(model="none"))
    store = StateStore(Path(state_dir)).open()
    tracker = SessionTracker("ws", store)
    context = JobEnv(settings, store, tracker, LLMClient(settings.llm), datetime.now)
    started = time.perf_counter()
    tracker.scan(Path(sessions) / sessionfile.filename_for_key(key))
    counting_hwm = children_hwm_mb(os.getpid())
    scan_seconds = time.perf_counter() - started
    scan_memory = memory_mb()
    pending = tracker.sessions[key].unarchived_messages
    run_id = store.create_run("consolidate", "ws", session_key=key)
    started = time.perf_counter()
    manifest = asyncio.run(consolidate.consolidate_session(context, key, run_id, reason="manual"))
    consolidate_seconds = time.perf_counter() - started
    memory = memory_mb()
    session = tracker.sessions[key]
    reply.send({
        "scan_seconds": scan_seconds, "consolidate_seconds": consolidate_seconds, "pending_before": pending,
        "unarchived_after": session.unarchived_messages, "chunks": len(manifest["chunks"]),
        "run_outcome": store.get_run(run_id).outcome, "hwm_after_scan_mb": scan_memory["VmHWM"],
        "vm_hwm_mb": memory["VmHWM"], "vm_rss_mb": memory["VmRSS"], "counting_process_hwm_mb": counting_hwm,
    })
    reply.close()
    store.close()


def bench_offline(sizes: Sizes, root: Path) -> dict:
    """Raw-archive one big session in a child process; verify every message marker reached history."""
    count = sizes.offline_messages
    print(f"\n1. Offline (raw) consolidation of one {count}-message session (child process)")
    workspace, sessions = make_workspace(root / "offline")
    key = "telegram:424242"
    path = write_session(sessions, key, nanobot_conversation(count, tag="c0"))
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=offline_worker,
                            args=(str(workspace), str(sessions), str(root / "offline-state"), key, sender))
    child.start()
    sender.close()
    # sampled from here, not in the child: a sampler there would take its GIL from the run it measures
    with TreePeak(child.pid) as together:
        figures = receiver.recv()
    child.join()
    figures["with_counting_process_peak_rss_mb"] = round(together.peak_mb, 1)
    entries = history_entries(workspace)
    found = Counter(marker for entry in entries for marker in markers_in(entry["content"]))
    missing = count - len(found)
    duplicated = sum(times - 1 for times in found.values())
    total = figures["scan_seconds"] + figures["consolidate_seconds"]
    figures.update({
        "messages": count, "file_mb": round(path.stat().st_size / 1e6, 1), "history_entries": len(entries),
        "raw_entries": sum(entry["content"].startswith("[RAW]") for entry in entries),
        "history_mb": round((workspace / "memory" / "history.jsonl").stat().st_size / 1e6, 1),
        "markers_missing": missing, "markers_duplicated": duplicated,
        "consolidate_messages_per_second": round(count / figures["consolidate_seconds"]),
        "end_to_end_messages_per_second": round(count / total),
        "all_messages_in_history": missing == 0 and duplicated == 0 and figures["unarchived_after"] == 0,
    })
    print(f"   session file {figures['file_mb']} MB; scan {figures['scan_seconds']:.1f} s,"
          f" consolidate_session {figures['consolidate_seconds']:.1f} s ({figures['chunks']} chunks,"
          f" outcome {figures['run_outcome']})")
    print(f"   throughput: {figures['consolidate_messages_per_second']} messages/s archiving,"
          f" {figures['end_to_end_messages_per_second']} messages/s scan + archive")
    print(f"   peak RSS (VmHWM) {figures['vm_hwm_mb']:.1f} MB (after the scan {figures['hwm_after_scan_mb']:.1f} MB);"
          f" VmRSS at the end {figures['vm_rss_mb']:.1f} MB; the counting process's peak"
          f" {figures['counting_process_hwm_mb']:.1f} MB; both together at most"
          f" {figures['with_counting_process_peak_rss_mb']:.1f} MB (RSS and its child's private memory, every 20 ms)")
    print(f"   history: {figures['history_entries']} entries ({figures['raw_entries']} [RAW]),"
          f" {figures['history_mb']} MB")
    verdict = "OK" if figures["all_messages_in_history"] else "FAILED"
    print(f"   correctness: {count - missing}/{count} markers in history, {missing} missing, {duplicated} duplicated,"
          f" {figures['unarchived_after']} left unarchived -> {verdict}")
    return figures


# -- 2: the offline session through a real daemon ------------------------------------------------------
def bench_daemon_consolidate(sizes: Sizes, root: Path) -> dict:
    """A real daemon (offline, owner) starts on one big session; `nanobotctl consolidate` until none is left."""
    count = sizes.offline_messages
    print(f"\n2. One {count}-message session through a real daemon (offline, owner):"
          " start, first scan, `nanobotctl consolidate` until nothing is unarchived")
    workspace, sessions = make_workspace(root / "daemon")
    key = "telegram:434343"
    path = write_session(sessions, key, nanobot_conversation(count, tag="c0"))
    daemon = BenchDaemon(root / "daemon-run", workspace, sessions,
                         workspace_lines='consolidation = { mode = "owner" }\n')
    started = time.monotonic()
    daemon.start(wait=False)
    together = TreePeak(daemon.proc.pid).start()
    try:
        scanned = daemon.wait_reconciled(1, started)
        memory_after_scan = memory_mb(daemon.proc.pid)
        index_before = _index_refreshes(daemon)
        consolidating = time.monotonic()
        commands, left = 0, None
        while commands < DAEMON_CONSOLIDATE_ROUNDS:
            commands += 1
            done = subprocess.run([sys.executable, "-c", CTL, "--socket", str(daemon.socket),
                                   "--timeout", str(DRAIN_TIMEOUT_SECONDS), "consolidate", key],
                                  capture_output=True, text=True, timeout=DRAIN_TIMEOUT_SECONDS)
            if done.returncode != 0:
                raise RuntimeError(f"nanobotctl consolidate failed: {done.stderr}\n{daemon.log()[-3000:]}")
            left = _unarchived(daemon, key)
            if left == 0:
                break
        finished = time.monotonic()
        index_after = _index_refreshes(daemon)
        memory = memory_mb(daemon.proc.pid)
        children_hwm = children_hwm_mb(daemon.proc.pid)
        cpu = cpu_seconds(daemon.proc.pid)[0]
    finally:
        together.stop()
        _stop(daemon)
    entries = history_entries(workspace)
    found = Counter(marker for entry in entries for marker in markers_in(entry["content"]))
    missing = count - len(found)
    duplicated = sum(times - 1 for times in found.values())
    figures = {
        "messages": count, "file_mb": round(path.stat().st_size / 1e6, 1),
        "scan_seconds": round(scanned, 2), "consolidate_seconds": round(finished - consolidating, 2),
        "total_seconds": round(finished - started, 2), "consolidate_commands": commands, "unarchived_after": left,
        "end_to_end_messages_per_second": round(count / (finished - started)),
        "consolidate_messages_per_second": round(count / (finished - consolidating)),
        "daemon_cpu_seconds": round(cpu, 1), "vm_hwm_after_scan_mb": round(memory_after_scan["VmHWM"], 1),
        "vm_hwm_mb": round(memory["VmHWM"], 1), "vm_rss_mb": round(memory["VmRSS"], 1),
        "children_vm_hwm_mb": children_hwm, "with_children_peak_rss_mb": round(together.peak_mb, 1),
        "history_entries": len(entries), "markers_missing": missing,
        "markers_duplicated": duplicated,
        "all_messages_in_history": missing == 0 and duplicated == 0 and left == 0,
        # the index refreshes beside the consolidation share the daemon's CPU with it: the same tree took
        # 8 s or 12 s for it, depending on how much of the session's first index refresh overlapped it
        "index_refresh_seconds_during": round(index_after["refresh_seconds"] - index_before["refresh_seconds"], 1),
        "index_refreshes_ended_during": index_after["refreshes"] - index_before["refreshes"],
    }
    print(f"   session file {figures['file_mb']} MB; first scan done {figures['scan_seconds']:.1f} s after the start;"
          f" {commands} consolidate command(s) took {figures['consolidate_seconds']:.1f} s")
    print(f"   throughput: {figures['end_to_end_messages_per_second']} messages/s from the start,"
          f" {figures['consolidate_messages_per_second']} messages/s from the first consolidate"
          f" (daemon CPU {figures['daemon_cpu_seconds']:.1f} s)")
    print(f"   beside it, index refreshes ran {figures['index_refresh_seconds_during']:.1f} s of the"
          f" {figures['consolidate_seconds']:.1f} s ({figures['index_refreshes_ended_during']} ended meanwhile)")
    print(f"   daemon peak RSS (VmHWM) {figures['vm_hwm_mb']:.1f} MB (after the scan"
          f" {figures['vm_hwm_after_scan_mb']:.1f} MB); VmRSS at the end {figures['vm_rss_mb']:.1f} MB;"
          f" its children's (the counting process, if still there) {children_hwm:.1f} MB; the daemon and its children"
          f" together held at most {together.peak_mb:.1f} MB (RSS and their private memory, every 20 ms)")
    verdict = "OK" if figures["all_messages_in_history"] else "FAILED"
    print(f"   correctness: {count - missing}/{count} markers in history, {missing} missing, {duplicated} duplicated,"
          f" {left} left unarchived -> {verdict}")
    return figures


# -- 3: saves that are not appends, through a real daemon ----------------------------------------------
def bench_daemon_rewrite(sizes: Sizes, root: Path) -> dict:
    """A real daemon holds one long session's unarchived messages; the agent then saves it with a checkpoint
    inserted mid-file (every held row moves to the new version of the file), then clears it (/new: every row is
    copied out of the held version, and the rescue archives them). The daemon's peak RSS after each."""
    count = sizes.offline_messages
    print(f"\n3. One {count}-message session through a real daemon, saved by the agent in ways that are not"
          " appends: a checkpoint inserted mid-file, then /new")
    workspace, sessions = make_workspace(root / "rewrite")
    key = "telegram:454545"
    conversation = nanobot_conversation(count, tag="c1")
    path = write_session(sessions, key, conversation)
    daemon = BenchDaemon(root / "rewrite-run", workspace, sessions)
    started = time.monotonic()
    daemon.start(wait=False)
    try:
        daemon.wait_reconciled(1, started)
        figures = {"messages": count, "file_mb": round(path.stat().st_size / 1e6, 1),
                   "vm_rss_after_scan_mb": round(memory_mb(daemon.proc.pid)["VmRSS"], 1)}
        checkpoint = {"role": "assistant", "content": "Checkpoint: the conversation so far, summarised.",
                      "timestamp": "2026-11-01T12:00:00", "_hidden_history": True}
        write_session(sessions, key, conversation[:count // 2] + [checkpoint] + conversation[count // 2:])
        figures["checkpoint_seconds"] = round(_wait_messages(daemon, key, count + 1), 2)
        figures["checkpoint_vm_hwm_mb"] = round(memory_mb(daemon.proc.pid)["VmHWM"], 1)
        write_session(sessions, key, [])
        figures["new_seconds"] = round(_wait_messages(daemon, key, 0), 2)
        figures["new_vm_hwm_mb"] = round(memory_mb(daemon.proc.pid)["VmHWM"], 1)
        daemon.wait_settled(1, timeout=DRAIN_TIMEOUT_SECONDS)
        figures["rescued_vm_hwm_mb"] = round(memory_mb(daemon.proc.pid)["VmHWM"], 1)
        figures["unarchived_after"] = _unarchived(daemon, key)
    finally:
        _stop(daemon)
    figures["vm_hwm_mb"] = max(figures["checkpoint_vm_hwm_mb"], figures["new_vm_hwm_mb"])
    print(f"   session file {figures['file_mb']} MB;"
          f" VmRSS after the first scan {figures['vm_rss_after_scan_mb']:.1f} MB")
    print(f"   checkpoint inserted mid-file: scanned after {figures['checkpoint_seconds']:.1f} s,"
          f" peak RSS (VmHWM) {figures['checkpoint_vm_hwm_mb']:.1f} MB")
    print(f"   /new: scanned after {figures['new_seconds']:.1f} s, peak RSS {figures['new_vm_hwm_mb']:.1f} MB;"
          f" once the rescue archived them {figures['rescued_vm_hwm_mb']:.1f} MB,"
          f" {figures['unarchived_after']} left unarchived")
    return figures


def _wait_messages(daemon: BenchDaemon, key: str, messages: int) -> float:
    """Seconds until the daemon shows the session with *messages* messages (its save scanned)."""
    started = time.monotonic()
    while time.monotonic() - started < DRAIN_TIMEOUT_SECONDS:
        daemon.check_alive()
        rows = (daemon.poll("/v1/sessions") or {}).get("sessions", [])
        if any(row["key"] == key and row["messages"] == messages for row in rows):
            return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"the daemon never showed {key} with {messages} messages:\n{daemon.log()[-3000:]}")


def _stop(daemon: BenchDaemon) -> None:
    """SIGTERM, waiting out the index refresh of the history just written; SIGKILL past STOP_SECONDS."""
    try:
        daemon.stop(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        print(f"   (the daemon did not exit within {STOP_SECONDS:.0f} s of SIGTERM; killed)")
        daemon.kill()


def _index_refreshes(daemon: BenchDaemon) -> dict:
    """The workspace's index refreshes so far, from status: how many ended, and the seconds they ran (the one
    running included)."""
    search = daemon.client.get("/v1/status")["workspaces"][0]["search"]
    return {name: search.get(name, 0) for name in ("refreshes", "refresh_seconds")}


def _unarchived(daemon: BenchDaemon, key: str) -> int:
    """The session's unarchived messages, as `nanobotctl sessions` shows them."""
    rows = daemon.client.get("/v1/sessions")["sessions"]
    return next(row["unarchived_messages"] for row in rows if row["key"] == key)


# -- 4: the floor of raw archiving ----------------------------------------------------------------------
def bench_floor(sizes: Sizes, root: Path) -> dict:
    """Raw-archive the session of part 1 in one pass with the fewest steps that keep its messages: the figure the
    real paths are measured against."""
    import sqlite3

    count = sizes.offline_messages
    print(f"\n4. The floor: one pass over a {count}-message session (decode, digest, [RAW] line, append + fsync,"
          " marks in SQLite)")
    workspace, sessions = make_workspace(root / "floor")
    path = write_session(sessions, "telegram:454545", nanobot_conversation(count, tag="c0"))
    history_path = workspace / "memory" / "history.jsonl"
    marks = sqlite3.connect(root / "floor.db", isolation_level=None)
    marks.execute("PRAGMA journal_mode=WAL")
    marks.execute("PRAGMA synchronous=NORMAL")
    marks.execute("CREATE TABLE archived (session_id INTEGER, digest TEXT, run_id TEXT,"
                  " PRIMARY KEY (session_id, digest))")
    steps = dict.fromkeys(("decode_and_digest", "render", "append", "marks"), 0.0)
    lines, digests, archived = [], [], 0
    started = time.perf_counter()
    with open(history_path, "ab") as history:
        def write_group() -> None:
            nonlocal lines, digests
            begun = time.perf_counter()
            content = f"[RAW] {len(lines)} messages\n" + "\n".join(lines)
            entry = {"cursor": archived, "timestamp": "", "content": content}
            history.write((json.dumps(entry, ensure_ascii=False) + "\n").encode())
            history.flush()
            os.fsync(history.fileno())
            appended = time.perf_counter()
            marks.execute("BEGIN")
            marks.executemany("INSERT OR IGNORE INTO archived VALUES (1, ?, 'floor')",
                              [(digest,) for digest in digests])
            marks.execute("COMMIT")
            steps["append"] += appended - begun
            steps["marks"] += time.perf_counter() - appended
            lines, digests = [], []

        for line in sessionfile.iter_raw_lines(path):
            begun = time.perf_counter()
            record = sessionfile.decode_record(line)
            fields = sessionfile.message_fields(record) if record else None
            if fields is None:
                continue
            role, text, stamp = fields
            digests.append(sessionfile.message_digest(role, text, stamp, plain=b"\\" not in line.data))
            decoded = time.perf_counter()
            lines.append(f"[{stamp[:16]}] {role.upper()}: {text}")
            archived += 1
            steps["decode_and_digest"] += decoded - begun
            steps["render"] += time.perf_counter() - decoded
            if len(digests) >= FLOOR_GROUP:
                write_group()
        if digests:
            write_group()
    seconds = time.perf_counter() - started
    marks.close()
    found = Counter(marker for entry in history_entries(workspace) for marker in markers_in(entry["content"]))
    figures = {"messages": count, "archived": archived, "seconds": round(seconds, 2),
               "messages_per_second": round(count / seconds), "all_messages_in_history": len(found) == count,
               **{f"{step}_seconds": round(value, 2) for step, value in steps.items()}}
    print(f"   {figures['messages_per_second']} messages/s ({seconds:.2f} s: "
          + ", ".join(f"{step} {value:.2f} s" for step, value in steps.items()) + ")")
    return figures


# -- main -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run the parts in a temporary folder and print (and optionally save) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--only", help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    parser.add_argument("--messages", type=int,
                        help=f"messages of the big session (default {FULL.offline_messages}, --quick"
                             f" {QUICK.offline_messages})")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be a positive whole number")
    parts = args.only.split(",") if args.only else list(PARTS)
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    sizes = QUICK if args.quick else FULL
    if args.messages is not None:
        sizes = Sizes(args.messages)
    print(f"nanobotd consolidation benchmark ({'quick' if args.quick else 'full'} sizes, {os.cpu_count()} CPUs)")
    figures: dict = {"sizes": asdict(sizes)}
    with tempfile.TemporaryDirectory(prefix="nanobotd-bench-consolidate-") as folder:
        root = Path(folder)
        if "offline" in parts:
            figures["offline"] = bench_offline(sizes, root)
        if "daemon" in parts:
            figures["daemon"] = bench_daemon_consolidate(sizes, root)
        if "rewrite" in parts:
            figures["rewrite"] = bench_daemon_rewrite(sizes, root)
        if "floor" in parts:
            figures["floor"] = bench_floor(sizes, root)
            for part in ("offline", "daemon"):
                if part in figures:
                    ratio = figures["floor"]["messages_per_second"] / figures[part]["end_to_end_messages_per_second"]
                    figures["floor"][f"{part}_slower_by"] = round(ratio, 2)
                    print(f"   part {PARTS.index(part) + 1} ({part}) runs {ratio:.1f}x slower than the floor")
    save_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
