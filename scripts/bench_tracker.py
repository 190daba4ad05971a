#!/usr/bin/env python3
"""Session tracker benchmarks: what watching sessions costs, and how fast a change is seen.

1. Idle cost: a real `nanobotd run` subprocess (offline, default [daemon] settings) watching 100 sessions
   of ~50 nanobot-format messages, after its start-up reconcile and first index refresh settled: CPU
   seconds per minute from /proc/<pid>/stat over the idle window, then VmRSS/VmHWM from /proc/<pid>/status
   once the daemon has given its idle tokenizer back (never earlier than the window's end), and whether
   litellm was imported (its compiled dependencies mapped in /proc/<pid>/maps).
2. Change latency: nanobot's atomic rewrite (temp + rename) of one session adding one message, until the
   daemon's control socket reports the new message count (polled every 10 ms, in-process over the socket
   as nanobotctl talks to it); p50/p95 with the default debounce.
3. Incremental cost (in-process): SessionTracker.scan after one appended message on sessions of 10,000 and
   100,000 messages, against re-parsing and re-counting the whole file as nanobot does each turn.
4. Start-up reconcile of 1,000 sessions x 200 messages: a real daemon's cold start (empty state DB) until
   its status shows every session reconciled, with its RSS then; Workspace.reconcile() in-process, cold
   and warm (DB up to date, files unchanged); the per-session spool pass the daemon runs after its
   start-up reconcile; and real daemon starts on the warm DB (scripts/bench_startup.py).
5. Idle memory with an LLM configured: a real daemon against the fake OpenAI-compatible server runs one
   consolidation through the LLM, then sits idle; its RSS (and its children's: the LLM worker) 5 minutes
   after the last LLM answer (--llm-idle-seconds, also the worker's llm.idle_exit_seconds), sampled on the
   way (scripts/bench_llm_idle.py).

    scripts/bench_tracker.py [--quick] [--idle-seconds N] [--llm-idle-seconds N] [--sessions N]
                             [--messages N] [--only PARTS] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_content import nanobot_conversation  # noqa: E402
from bench_daemon import BenchDaemon, cpu_seconds, memory_mb, percentile, save_figures, verdict  # noqa: E402
from bench_llm_idle import bench_llm_idle  # noqa: E402
from bench_startup import bench_cold_start, bench_reconcile, write_reconcile_sessions  # noqa: E402

from nanobotd.config.schema import DaemonSettings  # noqa: E402
from nanobotd.daemon.daemon import IDLE_CHECK_SECONDS, TICK_SECONDS, TOKENIZER_IDLE_SECONDS  # noqa: E402
from nanobotd.sessions import file as sessionfile  # noqa: E402
from nanobotd.sessions.tracker import SessionTracker  # noqa: E402
from nanobotd.state.store import StateStore  # noqa: E402
from nanobotd.tokens import DEFAULT_ENCODING, count_tokens, get_encoding  # noqa: E402
from tests.support.observe import litellm_mappings  # noqa: E402
from tests.support.workspace import make_workspace, write_session  # noqa: E402

TARGET_IDLE_CPU_PER_MINUTE = 0.3
TARGET_IDLE_RSS_MB = 60.0
TARGET_LATENCY_MARGIN = 0.150
TARGET_INCREMENTAL_RATIO = 20.0
POLL_SECONDS = 0.010
# Seconds between one rewrite being seen and the next: agent turns a few seconds apart.
REWRITE_GAP_SECONDS = (1.5, 4.5)
# The daemon drops a tokenizer unused for TOKENIZER_IDLE_SECONDS, checking at most every IDLE_CHECK_SECONDS.
TOKENIZER_RELEASED_SECONDS = TOKENIZER_IDLE_SECONDS + IDLE_CHECK_SECONDS + 2 * TICK_SECONDS
PARTS = ("daemon", "incremental", "reconcile", "cold-start", "llm-idle")


@dataclass(frozen=True)
class Sizes:
    """How big each part runs."""

    idle_sessions: int
    idle_messages: int
    idle_seconds: float
    rewrites: int
    incremental_sizes: tuple[int, ...]
    incremental_runs: int
    reconcile_sessions: int
    reconcile_messages: int
    llm_idle_seconds: float


FULL = Sizes(100, 50, 120.0, 30, (10_000, 100_000), 5, 1000, 200, 300.0)
QUICK = Sizes(20, 50, 10.0, 10, (1_000, 10_000), 3, 100, 50, 30.0)


# -- 1 and 2: idle cost and change latency -----------------------------------------------------------------
def bench_daemon(sizes: Sizes, root: Path) -> dict:
    """Idle CPU and memory of a daemon watching sessions, then the latency of seeing one rewrite."""
    workspace, sessions = make_workspace(root / "daemon")
    conversations = {}
    for number in range(sizes.idle_sessions):
        key = f"telegram:{100000 + number}"
        conversations[key] = nanobot_conversation(sizes.idle_messages + sizes.rewrites, tag=f"d{number}", seed=1)
        write_session(sessions, key, conversations[key][:sizes.idle_messages])
    daemon = BenchDaemon(root / "daemon-run", workspace, sessions).start()
    try:
        settle = daemon.wait_settled(sizes.idle_sessions)
        idle = measure_idle(daemon, sizes.idle_seconds)
        idle["sessions"] = sizes.idle_sessions
        idle["settle_seconds"] = round(settle, 2)
        key = next(iter(conversations))
        latency = measure_change_latency(daemon, sessions, key, conversations[key], sizes)
    finally:
        daemon.stop()
    print_idle(idle)
    print_latency(latency)
    return {"idle": idle, "change_latency": latency}


def measure_idle(daemon: BenchDaemon, seconds: float) -> dict:
    """CPU over a window of *seconds*; memory and the litellm check once the idle tokenizer is given back.

    The daemon was settled (no job, CPU quiet) when this starts, so its tokenizer was last used before now
    and is released within TOKENIZER_RELEASED_SECONDS; memory is read then, or at the window's end if later.
    """
    pid = daemon.proc.pid
    settled_at = time.monotonic()
    rss_at_start = memory_mb(pid)["VmRSS"]
    cpu_before, children_before = cpu_seconds(pid)
    time.sleep(seconds)
    cpu_after, children_after = cpu_seconds(pid)
    wall = time.monotonic() - settled_at
    time.sleep(max(0.0, settled_at + TOKENIZER_RELEASED_SECONDS - time.monotonic()))
    memory_read_after = time.monotonic() - settled_at
    memory = memory_mb(pid)
    mapped = litellm_mappings(pid)
    per_minute = (cpu_after - cpu_before) / wall * 60
    return {
        "window_seconds": round(wall, 1), "cpu_seconds_per_minute": round(per_minute, 4),
        "children_cpu_seconds_per_minute": round((children_after - children_before) / wall * 60, 4),
        "vm_rss_mb": round(memory["VmRSS"], 1), "vm_hwm_mb": round(memory["VmHWM"], 1),
        "vm_rss_at_window_start_mb": round(rss_at_start, 1), "memory_read_after_seconds": round(memory_read_after, 1),
        "litellm_imported": bool(mapped), "litellm_mappings": mapped,
        "cpu_pass": per_minute < TARGET_IDLE_CPU_PER_MINUTE, "rss_pass": memory["VmRSS"] < TARGET_IDLE_RSS_MB,
    }


def measure_change_latency(daemon: BenchDaemon, sessions: Path, key: str, conversation: list[dict],
                           sizes: Sizes) -> dict:
    """Rewrite one session adding one message; time until the socket reports the new count."""
    debounce = DaemonSettings().debounce_seconds
    path = f"/v1/sessions/{quote(key, safe='')}"
    latencies = []
    count = sizes.idle_messages
    rng = random.Random(7)
    for _ in range(sizes.rewrites):
        time.sleep(rng.uniform(*REWRITE_GAP_SECONDS))
        count += 1
        write_session(sessions, key, conversation[:count])
        written = time.monotonic()
        while daemon.client.get(path)["session"]["messages"] != count:
            if time.monotonic() - written > 30:
                raise RuntimeError(f"the daemon never saw message {count} of {key}")
            time.sleep(POLL_SECONDS)
        latencies.append(time.monotonic() - written)
    p95 = percentile(latencies, 0.95)
    return {
        "debounce_seconds": debounce, "rewrites": len(latencies), "poll_seconds": POLL_SECONDS,
        "gap_seconds": list(REWRITE_GAP_SECONDS),
        "p50_seconds": round(statistics.median(latencies), 4), "p95_seconds": round(p95, 4),
        "max_seconds": round(max(latencies), 4), "target_p95_seconds": debounce + TARGET_LATENCY_MARGIN,
        "pass": p95 < debounce + TARGET_LATENCY_MARGIN,
    }


def print_idle(idle: dict) -> None:
    """Part 1 as text."""
    print(f"\n1. Idle cost: daemon watching {idle['sessions']} sessions (settled after {idle['settle_seconds']} s),"
          f" window {idle['window_seconds']} s")
    print(f"   CPU            {idle['cpu_seconds_per_minute']:.3f} CPU-s/min   target < {TARGET_IDLE_CPU_PER_MINUTE}"
          f"   {verdict(idle['cpu_pass'])}   (children {idle['children_cpu_seconds_per_minute']:.3f})")
    print(f"   VmRSS          {idle['vm_rss_mb']:.1f} MB   target < {TARGET_IDLE_RSS_MB:.0f}   "
          f"{verdict(idle['rss_pass'])}   (read {idle['memory_read_after_seconds']:.0f} s after settling, tokenizer"
          f" released; {idle['vm_rss_at_window_start_mb']:.1f} MB at the window's start; VmHWM"
          f" {idle['vm_hwm_mb']:.1f} MB)")
    mapped = ", ".join(idle["litellm_mappings"])
    print(f"   litellm        {'IMPORTED: ' + mapped if idle['litellm_imported'] else 'not imported'}")


def print_latency(latency: dict) -> None:
    """Part 2 as text."""
    print(f"\n2. Change latency: {latency['rewrites']} atomic rewrites, +1 message each,"
          f" {latency['gap_seconds'][0]}-{latency['gap_seconds'][1]} s apart,"
          f" seen through the control socket (poll {latency['poll_seconds'] * 1000:.0f} ms)")
    print(f"   debounce {latency['debounce_seconds']:.3f} s   p50 {latency['p50_seconds']:.3f} s   "
          f"p95 {latency['p95_seconds']:.3f} s   max {latency['max_seconds']:.3f} s   "
          f"target p95 < {latency['target_p95_seconds']:.3f} s   {verdict(latency['pass'])}")


# -- 3: incremental cost --------------------------------------------------------------------------------
def recount_everything(path: Path, encoding: str = DEFAULT_ENCODING) -> int:
    """What nanobot pays each turn: decode every line and count every message's tokens again."""
    total = 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if "_type" in record or record.get("_command") or record.get("_hidden_history"):
                continue
            text = sessionfile.flatten_content(record.get("content"))
            total += count_tokens(sessionfile.message_text_for_tokens(record, text), encoding)
    return total


def bench_incremental(sizes: Sizes, root: Path) -> list[dict]:
    """scan() after one appended message vs a full re-parse and re-count, per session size."""
    get_encoding(DEFAULT_ENCODING)
    print("\n3. Incremental cost: one message appended (whole file rewritten), medians of "
          f"{sizes.incremental_runs} runs")
    results = []
    for count in sizes.incremental_sizes:
        folder = root / f"incremental-{count}"
        workspace, sessions = make_workspace(folder)
        key = "cli:direct"
        conversation = nanobot_conversation(count + sizes.incremental_runs, tag="i")
        path = write_session(sessions, key, conversation[:count])
        store = StateStore(folder / "state").open()
        try:
            tracker = SessionTracker("ws", store)
            started = time.perf_counter()
            tracker.scan(path)
            first_scan = time.perf_counter() - started
            incremental, full, agree = [], [], True
            for run in range(sizes.incremental_runs):
                write_session(sessions, key, conversation[:count + run + 1])
                started = time.perf_counter()
                result = tracker.scan(path)
                incremental.append(time.perf_counter() - started)
                started = time.perf_counter()
                total = recount_everything(path)
                full.append(time.perf_counter() - started)
                agree = agree and result.new_messages == 1 and tracker.sessions[key].total_tokens == total
        finally:
            store.close()
        row = {"messages": count, "file_mb": round(path.stat().st_size / 1e6, 1),
               "first_scan_seconds": round(first_scan, 3),
               "scan_median_seconds": round(statistics.median(incremental), 4),
               "full_recount_median_seconds": round(statistics.median(full), 4),
               "totals_agree": agree}
        row["ratio"] = round(row["full_recount_median_seconds"] / row["scan_median_seconds"], 1)
        print(f"   {count:>7} messages ({row['file_mb']} MB): scan {row['scan_median_seconds'] * 1000:.1f} ms"
              f"   full re-parse+count {row['full_recount_median_seconds'] * 1000:.1f} ms"
              f"   ratio {row['ratio']}x   (first scan {row['first_scan_seconds']:.2f} s;"
              f" token totals agree: {'yes' if agree else 'NO'})")
        results.append(row)
    largest = results[-1]
    largest["pass"] = largest["ratio"] >= TARGET_INCREMENTAL_RATIO
    print(f"   target >= {TARGET_INCREMENTAL_RATIO:.0f}x at {largest['messages']} messages: {verdict(largest['pass'])}")
    return results


# -- main -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts in temporary folders and print (and optionally save) the figures."""
    args = parse_arguments(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {"idle_seconds": args.idle_seconds, "llm_idle_seconds": args.llm_idle_seconds,
                 "reconcile_sessions": args.sessions, "reconcile_messages": args.messages}
    sizes = replace(sizes, **{name: value for name, value in overrides.items() if value is not None})
    parts = args.only.split(",") if args.only else list(PARTS)
    print(f"nanobotd tracker benchmark ({'quick' if args.quick else 'full'} sizes, {os.cpu_count()} CPUs;"
          f" parts: {', '.join(parts)})")
    figures: dict = {"sizes": asdict(sizes), "parts": parts}
    with tempfile.TemporaryDirectory(prefix="nanobotd-bench-tracker-") as folder:
        root = Path(folder)
        if "daemon" in parts:
            figures.update(bench_daemon(sizes, root))
        if "incremental" in parts:
            figures["incremental"] = bench_incremental(sizes, root)
        if "cold-start" in parts or "reconcile" in parts:
            count, messages = sizes.reconcile_sessions, sizes.reconcile_messages
            workspace, sessions = write_reconcile_sessions(count, messages, root)
            if "cold-start" in parts:
                figures["cold_start"] = bench_cold_start(root, workspace, sessions, count, messages)
            if "reconcile" in parts:
                figures["reconcile"] = bench_reconcile(root, workspace, sessions, count, messages)
        if "llm-idle" in parts:
            # the worker's idle exit set to the window read, so a shorter run (--quick) measures the same
            # thing as the full one: what stays once the worker is gone
            figures["llm_idle"] = bench_llm_idle(root, sizes.llm_idle_seconds, sizes.llm_idle_seconds)
    save_figures(args.json, figures)
    return 0


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line; every default in a help text is read from FULL and QUICK, so it cannot drift."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--idle-seconds", type=float,
                        help=f"idle CPU window (default {FULL.idle_seconds:g}, --quick {QUICK.idle_seconds:g})")
    parser.add_argument("--llm-idle-seconds", type=float,
                        help=f"part 5: seconds after the last LLM answer to read memory (default"
                             f" {FULL.llm_idle_seconds:g}, --quick {QUICK.llm_idle_seconds:g})")
    parser.add_argument("--sessions", type=int, help=f"part 4: sessions (default {FULL.reconcile_sessions},"
                                                     f" --quick {QUICK.reconcile_sessions})")
    parser.add_argument("--messages", type=int, help=f"part 4: messages per session (default"
                                                     f" {FULL.reconcile_messages}, --quick {QUICK.reconcile_messages})")
    parser.add_argument("--only", help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(PARTS) if args.only else set()
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    return args


if __name__ == "__main__":
    sys.exit(main())
