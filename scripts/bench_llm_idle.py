"""Idle memory with an LLM configured (part 5 of bench_tracker): what a daemon keeps after its last LLM call.

A real daemon talks to the fake OpenAI-compatible server (litellm runs for real, in the daemon's LLM
worker child), consolidates one session through it on request, then sits idle. Its RSS and its children's
(the LLM worker, while it lives) are sampled, and read for the figure a fixed time after the fake server's
last answer. The worker leaves after llm.idle_exit_seconds (300 by default).

    scripts/bench_llm_idle.py [--idle-seconds N] [--idle-exit-seconds N] [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_content import nanobot_conversation  # noqa: E402
from bench_daemon import BenchDaemon, save_figures, tree_memory_mb, verdict  # noqa: E402

from tests.support.fakellm import FakeLLM, Responder, Text  # noqa: E402
from tests.support.observe import child_pids, litellm_mappings  # noqa: E402

TARGET_RSS_MB = 60.0
SESSION_MESSAGES = 300
SUMMARY = "- [durable] The user keeps project kestrel on the Debian 12 staging server."
# The worker leaves llm.idle_exit_seconds after its last call; read a little later than the nominal time
# so the figure does not hinge on which of two equal timers fires first.
EXIT_MARGIN_SECONDS = 5.0
SAMPLES = 10
RUN_TIMEOUT_SECONDS = 120.0


class AnswerClock:
    """Notes when the fake server answered, so the idle time counts from the last LLM answer."""

    def __init__(self) -> None:
        self.answers: list[float] = []
        self._lock = threading.Lock()

    def answer(self, request: dict) -> Text:
        """The Responder body: a summary, stamped."""
        with self._lock:
            self.answers.append(time.monotonic())
        return Text(SUMMARY, prompt_tokens=3000, completion_tokens=20)


def bench_llm_idle(root: Path, idle_seconds: float, idle_exit_seconds: float | None = None) -> dict:
    """One consolidation through the fake LLM, then memory samples until *idle_seconds* after the answer;
    *idle_exit_seconds* sets llm.idle_exit_seconds (None: the daemon's default)."""
    exit_note = f", llm.idle_exit_seconds = {idle_exit_seconds:g}" if idle_exit_seconds is not None else ""
    print(f"\n5. Idle memory with an LLM configured: one consolidation through the fake server, then"
          f" {idle_seconds:g} s idle{exit_note}")
    from tests.support.workspace import make_workspace, write_session

    workspace, sessions = make_workspace(root / "llm-idle")
    key = "telegram:500000"
    write_session(sessions, key, nanobot_conversation(SESSION_MESSAGES, tag="l", seed=5))
    clock = AnswerClock()
    with FakeLLM(default=Responder(clock.answer)) as fake:
        exit_line = f"idle_exit_seconds = {idle_exit_seconds:g}\n" if idle_exit_seconds is not None else ""
        tables = (f'[llm]\nmodel = "{fake.model}"\napi_base = "{fake.base_url}"\n{exit_line}'
                  '[consolidation]\nmode = "owner"\nflush = false\n')
        daemon = BenchDaemon(root / "llm-idle-run", workspace, sessions, extra_tables=tables).start()
        try:
            daemon.wait_settled(1)
            before = tree_memory_mb(daemon.proc.pid)
            _consolidate(daemon, key)
            figures = _watch_idle(daemon, clock.answers[-1], idle_seconds)
        finally:
            daemon.stop()
    figures.update({"llm_requests": len(clock.answers), "idle_seconds": idle_seconds,
                    "idle_exit_seconds": idle_exit_seconds, "before_call_daemon_mb": before["daemon_mb"]})
    print_llm_idle(figures)
    return figures


def _consolidate(daemon: BenchDaemon, key: str) -> None:
    """Ask for a consolidation and wait until its run finished."""
    run_id = daemon.client.post("/v1/consolidate", {"session": key})["run_id"]
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        daemon.check_alive()
        answer = daemon.poll(f"/v1/runs/{run_id}")
        run = (answer or {}).get("run") or {}
        if run.get("state") in ("finished", "failed", "cancelled"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"consolidation run {run_id} did not finish:\n{daemon.log()[-3000:]}")


def _watch_idle(daemon: BenchDaemon, last_answer: float, idle_seconds: float) -> dict:
    """Samples of the daemon's and its children's RSS, then the figure at last answer + idle_seconds."""
    pid = daemon.proc.pid
    just_after = tree_memory_mb(pid)
    worker_mappings = {child: bool(litellm_mappings(child)) for child in child_pids(pid)}
    read_at = last_answer + idle_seconds + EXIT_MARGIN_SECONDS
    samples = []
    step = idle_seconds / SAMPLES
    for number in range(1, SAMPLES + 1):
        time.sleep(max(0.0, last_answer + number * step - time.monotonic()))
        daemon.check_alive()
        samples.append({"seconds": round(time.monotonic() - last_answer, 1), **tree_memory_mb(pid)})
    time.sleep(max(0.0, read_at - time.monotonic()))
    final = tree_memory_mb(pid)
    mapped = litellm_mappings(pid)
    return {
        "after_call": just_after, "children_with_litellm_after_call": sum(worker_mappings.values()),
        "samples": samples, "read_after_seconds": round(time.monotonic() - last_answer, 1),
        "daemon_mb": final["daemon_mb"], "children_mb": final["children_mb"], "total_mb": final["total_mb"],
        "daemon_litellm_imported": bool(mapped), "daemon_litellm_mappings": mapped,
        "pass": final["total_mb"] < TARGET_RSS_MB,
    }


def print_llm_idle(figures: dict) -> None:
    """Part 5 as text."""
    after = figures["after_call"]
    print(f"   before the call: daemon {figures['before_call_daemon_mb']:.1f} MB; just after"
          f" ({figures['llm_requests']} LLM request(s)): daemon {after['daemon_mb']:.1f} MB, children"
          f" {after['children_mb'] or 'none'} ({figures['children_with_litellm_after_call']} with litellm mapped)")
    trace = ", ".join(f"{sample['seconds']:.0f}s {sample['total_mb']:.0f}" for sample in figures["samples"])
    print(f"   daemon + children RSS (MB) after the last answer: {trace}")
    children = figures["children_mb"] or "none"
    print(f"   {figures['read_after_seconds']:.0f} s after the last LLM answer: daemon {figures['daemon_mb']:.1f} MB,"
          f" children {children}; total {figures['total_mb']:.1f} MB   target < {TARGET_RSS_MB:.0f}"
          f"   {verdict(figures['pass'])}   (litellm in the daemon: "
          f"{'IMPORTED' if figures['daemon_litellm_imported'] else 'no'})")


def main(argv: list[str] | None = None) -> int:
    """Part 5 alone, *runs* times, with the median and min of the idle figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-seconds", type=float, default=300.0,
                        help="read the figure this long after the last LLM answer (default 300)")
    parser.add_argument("--idle-exit-seconds", type=float, default=None,
                        help="llm.idle_exit_seconds for the daemon (default: the daemon's own, 300)")
    parser.add_argument("--runs", type=int, default=3, help="runs, each a fresh daemon (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    runs = []
    for number in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="nanobotd-bench-llm-idle-") as root:
            print(f"\nrun {number} of {args.runs}")
            runs.append(bench_llm_idle(Path(root), args.idle_seconds, args.idle_exit_seconds))
    totals = sorted(run["total_mb"] for run in runs)
    summary = {"runs": runs, "total_mb_median": round(statistics.median(totals), 1), "total_mb_min": totals[0],
               "target_mb": TARGET_RSS_MB}
    print(f"\ndaemon + children RSS {args.idle_seconds:g} s after the last LLM answer, {len(runs)} run(s):"
          f" median {summary['total_mb_median']:.1f} MB, min {totals[0]:.1f} MB   target < {TARGET_RSS_MB:.0f}"
          f"   {verdict(summary['total_mb_median'] < TARGET_RSS_MB)}")
    save_figures(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
