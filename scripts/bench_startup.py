"""Start-up benchmarks (part 4 of bench_tracker): reconciling many sessions, cold and warm, in a real daemon.

A cold start is a daemon on an empty state DB, timed from its process start until its status shows every
session reconciled; warm starts reuse the DB the in-process reconcile left behind.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_content import nanobot_conversation  # noqa: E402
from bench_daemon import BenchDaemon, TreePeak, children_hwm_mb, memory_mb, verdict  # noqa: E402

from nanobotd.config.schema import WorkspaceSettings  # noqa: E402
from nanobotd.daemon.workspace import Workspace  # noqa: E402
from nanobotd.state.store import StateStore  # noqa: E402
from tests.support.workspace import make_workspace, write_session  # noqa: E402

TARGET_WARM_RECONCILE_SECONDS = 2.0
TARGET_COLD_START_SECONDS = 3.0
TARGET_COLD_START_RSS_MB = 100.0
# status asked this often while a cold start reconciles (the reconcile's end is read from the daemon's log): asked every
# 50 ms, each answer took the daemon's GIL from the reconcile it measured
RECONCILE_POLL_SECONDS = 0.5


def write_reconcile_sessions(count: int, messages: int, root: Path) -> tuple[Path, Path]:
    """A workspace of *count* sessions of *messages* nanobot-format messages each."""
    workspace, sessions = make_workspace(root / "reconcile")
    started = time.perf_counter()
    for number in range(count):
        write_session(sessions, f"telegram:{200000 + number}",
                      nanobot_conversation(messages, tag=f"r{number}", seed=2))
    # at rest, as a daemon starting on an agent's sessions finds them: still cached, no longer being written back (the
    # kernel writing back the 130 MB just written slowed the cold start's every fsync, 0.2-0.3 s in all)
    os.sync()
    print(f"\n4. Start-up reconcile of {count} sessions x {messages} messages"
          f" (wrote the sessions in {time.perf_counter() - started:.1f} s)")
    return workspace, sessions


def bench_cold_start(root: Path, workspace: Path, sessions: Path, count: int, messages: int) -> dict:
    """A real daemon on an empty state DB: seconds until status shows every session reconciled, and RSS.

    The session files were just written (and synced), so they sit in the page cache: "cold" is the daemon's state.
    """
    daemon = BenchDaemon(root / "cold-start", workspace, sessions, state_dir=root / "cold-start-state")
    started = time.monotonic()
    daemon.start(wait=False)
    try:
        # any child is sampled while the reconcile runs (a cold start starts none)
        with TreePeak(daemon.proc.pid) as together:
            reconciled = daemon.wait_reconciled(count, started, poll=RECONCILE_POLL_SECONDS, by_log=True)
        at_reconcile = memory_mb(daemon.proc.pid)
        children_hwm = children_hwm_mb(daemon.proc.pid)
        settle = daemon.wait_settled(count)
        settled_memory = memory_mb(daemon.proc.pid)
    finally:
        daemon.stop()
    figures = {
        "sessions": count, "messages_per_session": messages,
        "cold_start_seconds": round(reconciled, 3), "cold_start_vm_rss_mb": round(at_reconcile["VmRSS"], 1),
        "cold_start_vm_hwm_mb": round(at_reconcile["VmHWM"], 1),
        "cold_start_children_vm_hwm_mb": children_hwm,
        "cold_start_total_vm_hwm_mb": round(at_reconcile["VmHWM"] + children_hwm, 1),
        "cold_start_together_peak_mb": round(together.peak_mb, 1),
        "cold_start_settled_seconds": round(reconciled + settle, 1),
        "cold_start_settled_vm_hwm_mb": round(settled_memory["VmHWM"], 1),
        "cold_start_slowest_status_seconds": round(daemon.slowest_status_seconds, 3),
    }
    figures["cold_start_pass"] = reconciled <= TARGET_COLD_START_SECONDS
    figures["cold_start_rss_pass"] = at_reconcile["VmHWM"] <= TARGET_COLD_START_RSS_MB
    print(f"   cold daemon start (empty state DB): all {count} sessions reconciled after {reconciled:.2f} s"
          f"   target <= {TARGET_COLD_START_SECONDS:.0f} s   {verdict(figures['cold_start_pass'])}")
    print(f"      peak RSS until then (VmHWM) {at_reconcile['VmHWM']:.0f} MB   target <= {TARGET_COLD_START_RSS_MB:.0f}"
          f"   {verdict(figures['cold_start_rss_pass'])}   (VmRSS then {at_reconcile['VmRSS']:.0f} MB; settled"
          f" after {reconciled + settle:.1f} s, VmHWM {settled_memory['VmHWM']:.0f} MB; slowest status answer"
          f" {daemon.slowest_status_seconds:.2f} s)")
    print(f"      beside it, its children's peak RSS (none expected) {children_hwm:.0f} MB;"
          f" the two together held at most {together.peak_mb:.0f} MB (RSS and the children's private memory,"
          f" every 20 ms)")
    return figures


def bench_reconcile(root: Path, workspace: Path, sessions: Path, count: int, messages: int) -> dict:
    """Cold and warm Workspace.reconcile(), then two real daemon starts on the warm state."""
    settings = WorkspaceSettings(path=workspace, name="ws", sessions_dir=sessions)
    state_dir = root / "reconcile-state"
    figures = {"sessions": count, "messages_per_session": messages}
    figures.update(_reconcile_in_process(settings, state_dir, cold=True))
    figures.update(_reconcile_in_process(settings, state_dir, cold=False))
    print(f"   in-process Workspace.reconcile(): cold {figures['cold_seconds']:.2f} s"
          f"   warm {figures['warm_seconds']:.3f} s (+ {figures['warm_load_seconds']:.3f} s loading the tracker)"
          f"   target warm < {TARGET_WARM_RECONCILE_SECONDS:.0f} s   "
          f"{verdict(figures['warm_seconds'] < TARGET_WARM_RECONCILE_SECONDS)}")
    print(f"   start-up vanished count the daemon runs after that (vanished_count per session, on its executor):"
          f" {figures['startup_pass_seconds']:.3f} s")
    figures["warm_pass"] = figures["warm_seconds"] < TARGET_WARM_RECONCILE_SECONDS
    figures.update(_daemon_starts(root, workspace, sessions, state_dir, count))
    return figures


def _reconcile_in_process(settings: WorkspaceSettings, state_dir: Path, *, cold: bool) -> dict:
    store = StateStore(state_dir).open()
    try:
        started = time.perf_counter()
        runtime = Workspace(settings, store, state_dir=state_dir, environ={}, home=None, now=datetime.now)
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        runtime.discover()
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
            reconciled = daemon.wait_reconciled(count, started)
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
