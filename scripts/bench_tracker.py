#!/usr/bin/env python3
"""Session tracker benchmarks: what watching sessions costs, and how fast a change is seen.

1. Idle cost: a real `nanobotd run` subprocess (offline, default [daemon] settings) watching 100 sessions
   of ~50 nanobot-format messages, after its start-up reconcile and first index refresh settled: CPU
   seconds per minute from /proc/<pid>/stat, VmRSS/VmHWM from /proc/<pid>/status, and whether litellm
   was imported (its compiled dependencies mapped in /proc/<pid>/maps).
2. Change latency: nanobot's atomic rewrite (temp + rename) of one session adding one message, until the
   daemon's control socket reports the new message count (polled every 10 ms, in-process over the socket
   as nanobotctl talks to it); p50/p95 with the default debounce.
3. Incremental cost (in-process): SessionTracker.scan after one appended message on sessions of 10,000 and
   100,000 messages, against re-parsing and re-counting the whole file as nanobot does each turn.
4. Start-up reconcile of 1,000 sessions x 200 messages: Workspace.reconcile() in-process, cold (empty
   state DB) and warm (DB up to date, files unchanged); plus the per-session spool pass the daemon runs
   after its start-up reconcile, and real daemon starts until the first status carrying a reconcile.

    scripts/bench_tracker.py [--quick] [--idle-seconds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanobotd.cli.nanobotctl import CannotConnect, Client, DaemonError  # noqa: E402
from nanobotd.config.schema import DaemonSettings, WorkspaceSettings  # noqa: E402
from nanobotd.daemon.workspace import Workspace  # noqa: E402
from nanobotd.sessions import file as sessionfile  # noqa: E402
from nanobotd.sessions.tracker import SessionTracker  # noqa: E402
from nanobotd.state.store import StateStore  # noqa: E402
from nanobotd.tokens import DEFAULT_ENCODING, count_tokens, get_encoding  # noqa: E402
from tests.support.daemonproc import DaemonProcess  # noqa: E402
from tests.support.workspace import make_workspace, write_session  # noqa: E402

TARGET_IDLE_CPU_PER_MINUTE = 0.3
TARGET_IDLE_RSS_MB = 60.0
TARGET_LATENCY_MARGIN = 0.150
TARGET_INCREMENTAL_RATIO = 20.0
TARGET_WARM_RECONCILE_SECONDS = 2.0
POLL_SECONDS = 0.010
# Seconds between one rewrite being seen and the next: agent turns a few seconds apart.
REWRITE_GAP_SECONDS = (1.5, 4.5)
SETTLE_TIMEOUT_SECONDS = 1800.0
QUIET_CPU_SECONDS = 0.02
# litellm drags in these compiled modules; nothing else the daemon imports does (Python files are read,
# not mapped, so litellm's own package never shows in /proc/<pid>/maps).
LITELLM_SIGNATURES = ("/litellm/", "/pydantic_core/", "/tokenizers/", "/aiohttp/")
WORDS = (
    "the a to of and in for on with deploy script kestrel staging server debian config nginx certificate "
    "renew cron backup database migration postgres index query latency budget invoice report quarterly "
    "meeting thursday dentist python tabs spaces review branch merge release notes customer ticket error "
    "timeout retry queue worker memory disk usage cluster node restart service log rotate alert threshold "
    "dashboard metric weekly plan draft email reply schedule flight hotel booking receipt expense summary "
    "please could you check why does it fail again after update yesterday tomorrow morning evening because "
    "version 3.11 2026 port 8080 /etc/nginx/nginx.conf ~/projects/kestrel README.md TODO FIXME ok thanks"
).split()
TOOLS = ("read_file", "exec", "web_search", "list_dir", "edit_file")


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


FULL = Sizes(100, 50, 120.0, 30, (10_000, 100_000), 5, 1000, 200)
QUICK = Sizes(20, 50, 10.0, 10, (1_000, 10_000), 3, 100, 50)


# -- nanobot-format content ----------------------------------------------------------------------------
def _words(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def _stamp(clock: datetime) -> str:
    return clock.isoformat(timespec="microseconds")


def nanobot_conversation(count: int, *, tag: str = "s", seed: int = 0,
                         start: datetime | None = None) -> list[dict]:
    """*count* messages shaped like nanobot 0.3.5 turns: user, tool calls and results, assistant reply.

    Every message carries a unique marker `MSG-<tag>-<index>` in its content, so an archive can be checked.
    """
    rng = random.Random(f"{tag}:{seed}")
    clock = start or datetime(2026, 11, 1, 9, 0)
    messages: list[dict] = []

    def add(message: dict) -> None:
        nonlocal clock
        clock += timedelta(seconds=rng.randint(1, 40), microseconds=rng.randint(0, 999_999))
        message["content"] = f"MSG-{tag}-{len(messages)} {message['content']}"
        message["timestamp"] = _stamp(clock)
        messages.append(message)

    while len(messages) < count:
        add({"role": "user", "content": _words(rng, 12, 70)})
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            call_id = f"call_{rng.getrandbits(48):012x}"
            tool = rng.choice(TOOLS)
            arguments = {"path": f"~/projects/kestrel/{rng.choice(WORDS)}.md"} if tool != "exec" else {
                "command": f"systemctl status {rng.choice(WORDS)} --no-pager"}
            add({"role": "assistant", "content": _words(rng, 3, 12), "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}]})
            output = "\n".join(f"{index + 1}: {_words(rng, 4, 14)}" for index in range(rng.randint(3, 30)))
            add({"role": "tool", "tool_call_id": call_id, "name": tool, "content": output})
        reply = {"role": "assistant", "content": _words(rng, 15, 150), "latency_ms": rng.randint(300, 4000)}
        if rng.random() < 0.2:
            reply["reasoning_content"] = _words(rng, 10, 60)
        add(reply)
    return messages[:count]


# -- /proc readers ---------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime + stime of the process, of its waited-for children) in seconds."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, (int(fields[13]) + int(fields[14])) / ticks


def memory_mb(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MB."""
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) / 1024
    return values


def litellm_mappings(pid: int) -> list[str]:
    """Files mapped by *pid* that only an imported litellm would bring in."""
    with open(f"/proc/{pid}/maps") as handle:
        paths = {line.split()[-1] for line in handle if "/" in line}
    return sorted(path for path in paths if any(mark in path for mark in LITELLM_SIGNATURES))


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def verdict(ok: bool) -> str:
    """PASS or FAIL against a target."""
    return "PASS" if ok else "FAIL"


# -- a daemon with the default [daemon] settings ----------------------------------------------------------
class BenchDaemon(DaemonProcess):
    """`nanobotd run` with the documented [daemon] defaults (debounce, reconcile period, INFO logging)."""

    def __init__(self, folder: Path, workspace: Path, sessions_dir: Path, *, state_dir: Path | None = None,
                 extra_tables: str = ""):
        home = folder / "home"
        runtime = folder / "run"
        for path in (home, runtime):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        environment = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                       "XDG_STATE_HOME": str(home / ".state"), "XDG_RUNTIME_DIR": str(runtime)}
        super().__init__(folder, workspace, sessions_dir=sessions_dir, env=environment)
        for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC", "INVOCATION_ID"):
            self.env.pop(name, None)
        if state_dir is not None:
            self.state_dir = state_dir
        self.config_path.write_text(
            f'[daemon]\nsocket = "{self.socket}"\nstate_dir = "{self.state_dir}"\nlog_level = "INFO"\n'
            f"{extra_tables}\n"
            f'[[workspaces]]\npath = "{workspace}"\nname = "ws"\nsessions_dir = "{sessions_dir}"\n')
        self.client = Client(self.socket, timeout=60)
        self.slowest_status_seconds = 0.0

    def status(self) -> dict | None:
        """GET /v1/status, or None while nothing answers; remembers the slowest answer (a blocked loop)."""
        asked = time.monotonic()
        try:
            status = self.client.get("/v1/status")
        except (CannotConnect, DaemonError):
            return None
        self.slowest_status_seconds = max(self.slowest_status_seconds, time.monotonic() - asked)
        return status

    def wait_settled(self, sessions: int, timeout: float = SETTLE_TIMEOUT_SECONDS) -> float:
        """Until the start-up reconcile, the first index refresh and all jobs are done and CPU is quiet."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            status = self.status()
            if status and _settled(status, sessions):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"daemon did not settle in {timeout}s:\n{self.log()[-3000:]}")
        while time.monotonic() - started < timeout:
            before = cpu_seconds(self.proc.pid)[0]
            time.sleep(1.0)
            if cpu_seconds(self.proc.pid)[0] - before < QUIET_CPU_SECONDS:
                break
        return time.monotonic() - started


def _settled(status: dict, sessions: int) -> bool:
    workspace = status["workspaces"][0]
    search = workspace.get("search") or {}
    return (workspace.get("last_reconcile") is not None and workspace.get("sessions_watched") == sessions
            and search.get("last_refresh") is not None and not search.get("pending_changes")
            and not status.get("jobs_running"))


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
    """CPU over a window of *seconds*, then memory and the litellm check."""
    pid = daemon.proc.pid
    # the daemon gives the tokenizer's memory back after a minute without new messages: show both ends
    rss_at_start = memory_mb(pid)["VmRSS"]
    cpu_before, children_before = cpu_seconds(pid)
    wall_before = time.monotonic()
    time.sleep(seconds)
    cpu_after, children_after = cpu_seconds(pid)
    wall = time.monotonic() - wall_before
    memory = memory_mb(pid)
    mapped = litellm_mappings(pid)
    per_minute = (cpu_after - cpu_before) / wall * 60
    return {
        "window_seconds": round(wall, 1), "cpu_seconds_per_minute": round(per_minute, 4),
        "children_cpu_seconds_per_minute": round((children_after - children_before) / wall * 60, 4),
        "vm_rss_mb": round(memory["VmRSS"], 1), "vm_hwm_mb": round(memory["VmHWM"], 1),
        "vm_rss_at_window_start_mb": round(rss_at_start, 1),
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
          f"{verdict(idle['rss_pass'])}   (VmHWM {idle['vm_hwm_mb']:.1f} MB;"
          f" {idle['vm_rss_at_window_start_mb']:.1f} MB at the window's start, tokenizer still loaded)")
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


# -- 4: start-up reconcile ------------------------------------------------------------------------------
def bench_reconcile(sizes: Sizes, root: Path) -> dict:
    """Cold and warm Workspace.reconcile(), then two real daemon starts on the warm state."""
    print(f"\n4. Start-up reconcile of {sizes.reconcile_sessions} sessions x {sizes.reconcile_messages} messages")
    workspace, sessions = make_workspace(root / "reconcile")
    started = time.perf_counter()
    for number in range(sizes.reconcile_sessions):
        write_session(sessions, f"telegram:{200000 + number}",
                      nanobot_conversation(sizes.reconcile_messages, tag=f"r{number}", seed=2))
    print(f"   (wrote the sessions in {time.perf_counter() - started:.1f} s)")
    settings = WorkspaceSettings(path=workspace, name="ws", sessions_dir=sessions)
    state_dir = root / "reconcile-state"
    figures = {"sessions": sizes.reconcile_sessions, "messages_per_session": sizes.reconcile_messages}
    figures.update(_reconcile_in_process(settings, state_dir, cold=True))
    figures.update(_reconcile_in_process(settings, state_dir, cold=False))
    print(f"   in-process Workspace.reconcile(): cold {figures['cold_seconds']:.2f} s"
          f"   warm {figures['warm_seconds']:.3f} s (+ {figures['warm_load_seconds']:.3f} s loading the tracker)"
          f"   target warm < {TARGET_WARM_RECONCILE_SECONDS:.0f} s   "
          f"{verdict(figures['warm_seconds'] < TARGET_WARM_RECONCILE_SECONDS)}")
    print(f"   start-up vanished count the daemon runs after that (vanished_count per session, on its executor):"
          f" {figures['startup_pass_seconds']:.3f} s")
    figures["warm_pass"] = figures["warm_seconds"] < TARGET_WARM_RECONCILE_SECONDS
    figures.update(_daemon_starts(root, workspace, sessions, state_dir, sizes.reconcile_sessions))
    return figures


def _reconcile_in_process(settings: WorkspaceSettings, state_dir: Path, *, cold: bool) -> dict:
    store = StateStore(state_dir).open()
    try:
        started = time.perf_counter()
        runtime = Workspace(settings, store, state_dir=state_dir, environ={}, home=None, now=datetime.now)
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        results = runtime.reconcile()
        seconds = time.perf_counter() - started
        changed = sum(result.changed for result in results)
        if cold:
            return {"cold_seconds": round(seconds, 3), "cold_changed": changed}
        started = time.perf_counter()
        for result in results:
            runtime.tracker.vanished_count(result.key)
        startup_pass = time.perf_counter() - started
        return {"warm_seconds": round(seconds, 4), "warm_load_seconds": round(loaded, 4), "warm_changed": changed,
                "startup_pass_seconds": round(startup_pass, 3)}
    finally:
        store.close()


def _daemon_starts(root: Path, workspace: Path, sessions: Path, state_dir: Path, count: int) -> dict:
    """Start a daemon twice on the warm state DB: time to the first status carrying a finished reconcile."""
    figures = {}
    for attempt, label in enumerate(("first daemon start (warm DB, no search index yet)",
                                     "second daemon start (warm DB and index)")):
        daemon = BenchDaemon(root / f"reconcile-daemon-{attempt}", workspace, sessions, state_dir=state_dir)
        started = time.monotonic()
        daemon.start(wait=False)
        try:
            reconciled = _wait_reconciled(daemon, started)
            settle = daemon.wait_settled(count)
            memory = memory_mb(daemon.proc.pid)
        finally:
            daemon.stop()
        slowest = daemon.slowest_status_seconds
        figures[f"daemon_start_{attempt + 1}_vm_rss_mb"] = round(memory["VmRSS"], 1)
        figures[f"daemon_start_{attempt + 1}_seconds"] = round(reconciled, 3)
        figures[f"daemon_start_{attempt + 1}_slowest_status_seconds"] = round(slowest, 3)
        figures[f"daemon_start_{attempt + 1}_settled_seconds"] = round(reconciled + settle, 1)
        print(f"   {label}: status shows all {count} sessions reconciled after {reconciled:.2f} s;"
              f" settled (index refreshed, CPU quiet) after {reconciled + settle:.1f} s;"
              f" slowest status answer meanwhile {slowest:.2f} s; VmRSS then {memory['VmRSS']:.0f} MB")
    return figures


def _wait_reconciled(daemon: BenchDaemon, started: float) -> float:
    while time.monotonic() - started < SETTLE_TIMEOUT_SECONDS:
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"daemon exited:\n{daemon.log()[-3000:]}")
        status = daemon.status()
        if status is not None and status["workspaces"][0].get("last_reconcile") is not None:
            return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError("daemon never reported a reconcile")


# -- main -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run the four parts in temporary folders and print (and optionally save) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--idle-seconds", type=float, help="idle CPU window (default 60, --quick 10)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.idle_seconds:
        sizes = Sizes(**{**asdict(sizes), "idle_seconds": args.idle_seconds})
    print(f"nanobotd tracker benchmark ({'quick' if args.quick else 'full'} sizes, {os.cpu_count()} CPUs)")
    figures: dict = {"sizes": asdict(sizes)}
    with tempfile.TemporaryDirectory(prefix="nanobotd-bench-tracker-") as folder:
        root = Path(folder)
        figures.update(bench_daemon(sizes, root))
        figures["incremental"] = bench_incremental(sizes, root)
        figures["reconcile"] = bench_reconcile(sizes, root)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
