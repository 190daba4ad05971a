#!/usr/bin/env python3
"""Where the CPU goes, and the fastest the work could be on this machine: the floors under the scale goals.

Two workloads, each part measured in a fresh process (its own CPU and its children's, from os.times):

1. One long session (--messages, default 100,000), scanned then archived raw (offline), as bench_consolidate's
   offline part does. Its parts:
   - the texts counted alone by a counting process (what the scan hands over), from its start to the last count;
   - the scan with a counter that answers at once (the parse and the spool, message cache and hold writes: the
     scanning thread's own work), and the parse alone that way;
   - the real scan (counted by the counting process) and the real archive.
2. A start-up reconcile of --sessions x --per-session messages, as bench_startup's cold start reads them. With
   parse processes (--parse-processes, as daemon.parse_processes; 16 new files or more, two cores or more):
   the files parsed and counted by them alone, the reconcile given their parses at once (the reconciling
   thread's own work), and the real reconcile. Without: the reconcile with a counter that answers at once, the
   texts counted alone, the real one.

From them it prints two floors against each goal:
- the serial floor: the parts that wait for each other, each as long as it took alone, its waits for the disk
  included (the spool rows carry the counts, the archive plans its chunks by them): max(parse, counting) +
  writes + archive; for the reconcile, which applies one file while the next is parsed (or counted), max(its own
  work, the parsing or the counting);
- the CPU floor: every part's CPU spread perfectly over the machine's cores.
A goal under both floors cannot be met by making the parts overlap better; only by less work per message.

    scripts/bench_floor.py [--messages N] [--sessions N] [--per-session N] [--parse-processes N]
                           [--only long,reconcile] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_content import nanobot_conversation  # noqa: E402
from bench_daemon import save_figures  # noqa: E402

from tests.support.workspace import make_workspace, write_session  # noqa: E402

GOAL_MESSAGES_PER_SECOND = 20_000
GOAL_COLD_START_SECONDS = 6.0
LONG_KEY = "telegram:424242"
DEFAULT_MESSAGES, DEFAULT_SESSIONS, DEFAULT_PER_SESSION = 100_000, 1000, 200  # bench_consolidate's, bench_startup's


class _Answered:
    """Counts already there: result() gives zeros at once."""

    def __init__(self, texts: list[str]) -> None:
        self._counts = [0] * len(texts)

    def result(self) -> list[int]:
        return self._counts


def answering_counter(texts: list[str], encoding_name: str) -> _Answered:
    """A counter that costs nothing: the scan's own work, without any counting."""
    return _Answered(texts)


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's: os.times, in clock ticks)."""
    times = os.times()
    return time.process_time(), times.children_user + times.children_system


def _texts(paths: list[Path]) -> list[str]:
    """The texts a scan hands over to be counted, read the way the scan reads them."""
    from nanobotd.sessions import file as sessionfile

    texts = []
    for path in paths:
        for line in sessionfile.iter_raw_lines(path, sessionfile.MESSAGE_LINE_BYTES):
            record = sessionfile.decode_record(line)
            fields = sessionfile.message_fields(record) if record is not None else None
            if fields is not None and not (record.get("_command") or record.get("_hidden_history")):
                texts.append(sessionfile.message_text_for_tokens(record, fields[1]))
    return texts


def part_counting(paths: list[str]) -> dict:
    """Every text counted by a fresh counting process, handed over in the scan's batches."""
    from nanobotd.sessions.scan import TOKEN_BATCH
    from nanobotd.tokenprocess import CountingProcess
    from nanobotd.tokens import DEFAULT_ENCODING

    texts = _texts([Path(path) for path in paths])
    counting = CountingProcess()
    started = time.perf_counter()
    pending = [counting.submit(texts[first:first + TOKEN_BATCH], DEFAULT_ENCODING)
               for first in range(0, len(texts), TOKEN_BATCH)]
    counted = sum(sum(batch.result()) for batch in pending)
    wall = time.perf_counter() - started
    counting.close()
    return {"texts": len(texts), "tokens": counted, "wall": wall, "child_cpu": _cpu()[1]}


def _tracker(state_dir: Path, counter, *, always: bool):
    """A tracker counting with *counter*; *always*: for any file (otherwise, as the daemon's: a long one)."""
    from nanobotd.sessions.tracker import SessionTracker
    from nanobotd.state.store import StateStore

    store = StateStore(state_dir).open()
    limit = {"process_scan_bytes": 0} if always else {}
    return store, SessionTracker("ws", store, counter=counter, **limit)


def part_parse(path: str) -> dict:
    """The parse of the long session alone, its counts answered at once."""
    from nanobotd.sessions.scan import parse_session
    from nanobotd.tokens import DEFAULT_ENCODING

    before, started = _cpu()[0], time.perf_counter()
    parsed = parse_session(Path(path), DEFAULT_ENCODING, counter=answering_counter)
    return {"messages": len(parsed.messages), "wall": time.perf_counter() - started, "cpu": _cpu()[0] - before}


def part_scan(path: str, state_dir: str, *, count: bool, archive: bool, workspace: str = "",
              sessions: str = "") -> dict:
    """The long session's scan (counted by a counting process, or answered at once), then its raw archive."""
    from nanobotd.tokenprocess import CountingProcess

    counting = CountingProcess() if count else None
    store, tracker = _tracker(Path(state_dir), counting.submit if counting else answering_counter,
                              always=counting is None)
    before, started = _cpu()[0], time.perf_counter()
    tracker.scan(Path(path))
    if counting is not None:
        counting.close()
    figures = {"wall": time.perf_counter() - started, "cpu": _cpu()[0] - before, "child_cpu": _cpu()[1]}
    if archive:
        figures.update(_archive(store, tracker, workspace, sessions))
    store.close()
    return figures


def _archive(store, tracker, workspace: str, sessions: str) -> dict:
    from nanobotd.config.schema import LLMSettings, WorkspaceSettings
    from nanobotd.jobs.consolidate import archive as consolidate
    from nanobotd.jobs.env import JobEnv
    from nanobotd.llm.client import LLMClient

    settings = WorkspaceSettings(path=Path(workspace), name="ws", sessions_dir=Path(sessions),
                                 llm=LLMSettings(model="none"))
    context = JobEnv(settings, store, tracker, LLMClient(settings.llm), datetime.now)
    run_id = store.create_run("consolidate", "ws", session_key=LONG_KEY)
    before, started = _cpu()[0], time.perf_counter()
    asyncio.run(consolidate.consolidate_session(context, LONG_KEY, run_id, reason="manual"))
    return {"archive_wall": time.perf_counter() - started, "archive_cpu": _cpu()[0] - before,
            "unarchived_after": tracker.sessions[LONG_KEY].unarchived_messages}


class _ReadyParses:
    """Parse processes whose parses are all made already: take() gives each at once."""

    answers: dict = {}

    def __init__(self, paths, encoding: str, processes: int) -> None:
        pass

    def take(self, path: Path):
        return self.answers.pop(Path(path), None)

    def close(self) -> None:
        pass


def _parse_first(paths: list[Path], encoding: str, processes: int) -> dict:
    """Every file parsed by the daemon's parse processes, from their start to the last parse taken; the reconcile
    that follows gets these parses at once (its own work without the parsing)."""
    from nanobotd.sessions import parsepool

    started = time.perf_counter()
    ahead = parsepool.ParsesAhead(paths, encoding, processes)
    _ReadyParses.answers = {path: ahead.take(path) for path in paths}
    wall = time.perf_counter() - started
    ahead.close()
    parsepool.ParsesAhead = _ReadyParses
    return {"parsing_wall": wall, "parsing_child_cpu": _cpu()[1],
            "parsed": sum(answer is not None for answer in _ReadyParses.answers.values())}


def part_reconcile(workspace: str, sessions: str, state_dir: str, *, own: bool, parse_processes: int = 0) -> dict:
    """Workspace.reconcile() on an empty state database, as the daemon reconciles. *own*: the reconciling thread's
    own work alone: where the daemon parses new files in processes, with their parses made first (timed as the
    parsing part); otherwise with counts answered at once."""
    from nanobotd.config.schema import WorkspaceSettings
    from nanobotd.daemon.workspace import Workspace
    from nanobotd.sessions import parsepool
    from nanobotd.state.store import StateStore

    settings = WorkspaceSettings(path=Path(workspace), name="ws", sessions_dir=Path(sessions))
    store = StateStore(Path(state_dir)).open()
    runtime = Workspace(settings, store, state_dir=Path(state_dir), environ={}, home=None, now=datetime.now,
                        parse_processes=parsepool.processes_for(os.cpu_count(), parse_processes))
    tracker, paths = runtime.tracker, sorted(Path(sessions).glob("*.jsonl"))
    figures: dict = {"parse_processes": tracker.parse_processes if len(paths) >= parsepool.MIN_NEW_FILES else 0}
    if own and figures["parse_processes"]:
        figures.update(_parse_first(paths, tracker.encoding, tracker.parse_processes))
    elif own:
        tracker.counter = answering_counter
    before, started = _cpu(), time.perf_counter()
    results = runtime.reconcile()
    figures.update(wall=time.perf_counter() - started, cpu=_cpu()[0] - before[0], sessions=len(results))
    store.close()  # the counting process was let go when the reconcile was done
    figures["child_cpu"] = _cpu()[1] - before[1]
    return figures


def in_child(function, *args, **kwargs) -> dict:
    """Run one part in a fresh process (spawned: nothing of this one's memory or children), return its figures."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(function, args, kwargs)


def bench_long(root: Path, messages: int, cores: int) -> dict:
    print(f"\n1. One session of {messages} messages: scan, then archive (offline)")
    workspace, sessions = make_workspace(root / "long")
    path = str(write_session(sessions, LONG_KEY, nanobot_conversation(messages, tag="c0")))
    counting = in_child(part_counting, [path])
    parse = in_child(part_parse, path)
    own = in_child(part_scan, path, str(root / "long-own"), count=False, archive=False)
    real = in_child(part_scan, path, str(root / "long-real"), count=True, archive=True,
                    workspace=str(workspace), sessions=str(sessions))
    writes, writes_wall = max(0.0, own["cpu"] - parse["cpu"]), max(0.0, own["wall"] - parse["wall"])
    serial = max(parse["wall"], counting["wall"]) + writes_wall + real["archive_wall"]
    total_cpu = own["cpu"] + counting["child_cpu"] + real["archive_cpu"]
    goal = messages / GOAL_MESSAGES_PER_SECOND
    figures = {  # to the millisecond: a small run's parse takes a few (400 messages: 4 ms, shown as 0.0 to 10 ms)
        "messages": messages, "cores": cores, "goal_seconds": round(goal, 3),
        "parse_cpu": round(parse["cpu"], 3), "parse_wall": round(parse["wall"], 3), "writes_cpu": round(writes, 3),
        "writes_wall": round(writes_wall, 3),
        "counting_wall": round(counting["wall"], 3), "counting_child_cpu": round(counting["child_cpu"], 3),
        "scan_wall": round(real["wall"], 3), "scan_cpu": round(real["cpu"], 3),
        "scan_child_cpu": round(real["child_cpu"], 3),
        "archive_wall": round(real["archive_wall"], 3), "archive_cpu": round(real["archive_cpu"], 3),
        "today_seconds": round(real["wall"] + real["archive_wall"], 3),
        "serial_floor_seconds": round(serial, 3), "cpu_floor_seconds": round(total_cpu / cores, 3),
        "unarchived_after": real["unarchived_after"],
    }
    print(f"   counting alone (a counting process, from its start): {counting['wall']:.2f} s for"
          f" {counting['texts']} texts ({counting['child_cpu']:.2f} CPU-s in it)")
    print(f"   the scanning thread's own work (counts answered at once): {own['wall']:.2f} s, {own['cpu']:.2f} CPU-s"
          f" = parse {parse['wall']:.2f} s ({parse['cpu']:.2f} CPU-s) + spool, message cache and hold writes"
          f" {writes_wall:.2f} s ({writes:.2f} CPU-s)")
    print(f"   the real scan {real['wall']:.2f} s ({real['cpu']:.2f} CPU-s here, {real['child_cpu']:.2f} in the"
          f" counting process); the archive {real['archive_wall']:.2f} s ({real['archive_cpu']:.2f} CPU-s);"
          f" {real['unarchived_after']} left unarchived")
    _print_floors(figures, goal, f"{GOAL_MESSAGES_PER_SECOND} msgs/s")
    return figures


def bench_reconcile(root: Path, count: int, per_session: int, cores: int, parse_processes: int = 0) -> dict:
    print(f"\n2. A start-up reconcile of {count} sessions x {per_session} messages (empty state database)")
    workspace, sessions = make_workspace(root / "many")
    paths = [str(write_session(sessions, f"telegram:{200000 + number}",
                               nanobot_conversation(per_session, tag=f"r{number}", seed=2)))
             for number in range(count)]
    own = in_child(part_reconcile, str(workspace), str(sessions), str(root / "many-own"), own=True,
                   parse_processes=parse_processes)
    real = in_child(part_reconcile, str(workspace), str(sessions), str(root / "many-real"), own=False,
                    parse_processes=parse_processes)
    figures = {
        "sessions": count, "messages_per_session": per_session, "cores": cores, "goal_seconds": GOAL_COLD_START_SECONDS,
        "parse_processes": own["parse_processes"],
        "reconcile_own_cpu": round(own["cpu"], 2), "reconcile_own_wall": round(own["wall"], 2),
        "today_seconds": round(real["wall"], 2), "reconcile_cpu": round(real["cpu"], 2),
        "reconcile_child_cpu": round(real["child_cpu"], 2),
    }
    if own["parse_processes"]:  # the files are parsed and counted in the parse processes, beside the writes
        other, other_cpu = own["parsing_wall"], own["parsing_child_cpu"]
        figures.update(parsing_wall=round(other, 2), parsing_child_cpu=round(other_cpu, 2), parsed=own["parsed"])
        print(f"   parsed and counted alone by {own['parse_processes']} parse processes, from their start:"
              f" {other:.2f} s for {own['parsed']} of {count} files ({other_cpu:.2f} CPU-s in them)")
        print(f"   the reconciling thread's own work (their parses given at once): {own['wall']:.2f} s,"
              f" {own['cpu']:.2f} CPU-s")
        children = "in the parse processes"
    else:  # the reconciling thread parses, and counts one file while it reads the next
        counting = in_child(part_counting, paths)
        other, other_cpu = counting["wall"], counting["child_cpu"]
        figures.update(counting_wall=round(other, 2), counting_child_cpu=round(other_cpu, 2))
        print(f"   counting alone (a counting process, from its start): {other:.2f} s for"
              f" {counting['texts']} texts ({other_cpu:.2f} CPU-s in it)")
        print(f"   the reconciling thread's own work (counts answered at once): {own['wall']:.2f} s,"
              f" {own['cpu']:.2f} CPU-s")
        children = "in the counting process"
    figures["serial_floor_seconds"] = round(max(own["wall"], other), 2)
    figures["cpu_floor_seconds"] = round((own["cpu"] + other_cpu) / cores, 2)
    print(f"   the real reconcile {real['wall']:.2f} s ({real['cpu']:.2f} CPU-s here,"
          f" {real['child_cpu']:.2f} {children}); a daemon adds its own start to this")
    _print_floors(figures, GOAL_COLD_START_SECONDS, f"{GOAL_COLD_START_SECONDS:g} s")
    return figures


def _print_floors(figures: dict, goal: float, goal_text: str) -> None:
    serial, cpu = figures["serial_floor_seconds"], figures["cpu_floor_seconds"]
    figures["goal_is"] = ("under both floors" if goal < min(serial, cpu) else "under the serial floor" if goal < serial
                          else "under the CPU floor" if goal < cpu else "above both floors")
    print(f"   today {figures['today_seconds']:.2f} s; serial floor {serial:.2f} s; CPU floor on"
          f" {figures['cores']} cores {cpu:.2f} s; the goal ({goal_text}) needs {goal:.2f} s: {figures['goal_is']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES,
                        help=f"messages of the long session (default {DEFAULT_MESSAGES})")
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS,
                        help=f"sessions of the reconcile (default {DEFAULT_SESSIONS})")
    parser.add_argument("--per-session", type=int, default=DEFAULT_PER_SESSION,
                        help=f"messages per session there (default {DEFAULT_PER_SESSION})")
    parser.add_argument("--parse-processes", type=int, default=0,
                        help="the reconcile's daemon.parse_processes (default 0, the daemon's default)")
    parser.add_argument("--only", default="long,reconcile", help="comma-separated parts (default long,reconcile)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    parts = args.only.split(",")
    print(f"nanobotd CPU floors ({cores} CPUs)")
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="nanobotd-bench-floor-") as folder:
        if "long" in parts:
            figures["long"] = bench_long(Path(folder), args.messages, cores)
        if "reconcile" in parts:
            figures["reconcile"] = bench_reconcile(Path(folder), args.sessions, args.per_session, cores,
                                                   args.parse_processes)
    save_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
