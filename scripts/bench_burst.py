#!/usr/bin/env python3
"""Burst benchmark: many sessions cross the consolidation budget at once; do the LLM slots stay busy?

A real `nanobotd run` (owner mode, flush off) against the fake OpenAI-compatible server (200 ms a request,
llm.concurrency 2, a 16,000-token window). Every session file is written at once, each 1.5 x the budget;
the daemon archives them all down to budget x ratio. Per run it prints and saves:

  utilisation   share of the LLM slots busy from the first request to the last answer
                (requests x latency / (concurrency x that span)); goal >= 95 %
  total/ideal   time from the first session write to the last answer, against the least time the
                requests need: requests x latency / concurrency; goal <= 1.10
  hand-over     how long a slot stays empty after an answer: the median gap to the next request's arrival,
                and the gaps over HANDOVER_STALL_MS (no request was ready) counted and summed
  max in flight the most requests the server saw at once (never above the concurrency)
  runs          consolidate runs in the ledger and their outcomes
  poll errors   answers other than 200 to GET /v1/sessions while the burst drains (must be none)

and when each session's first archive was seen. The daemon is polled with the requests `nanobotctl --json
sessions` and `nanobotctl --json runs` send, through nanobotctl's own client class in this process (a
nanobotctl subprocess 4 times a second would take a good share of the 2 cores the daemon is measured on).
With --runs N the figures are printed per run and as median and min; the JSON holds every run and, under
"burst", the median of each figure.

    scripts/bench_burst.py [--sessions 50] [--latency 0.2] [--concurrency 2] [--runs 3] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_content import nanobot_conversation  # noqa: E402
from bench_daemon import BenchDaemon, cpu_seconds, percentile, save_figures, verdict  # noqa: E402

from nanobotd.config.schema import LLMSettings  # noqa: E402
from nanobotd.sessions import file as sessionfile  # noqa: E402
from nanobotd.tokens import count_tokens  # noqa: E402
from tests.support.fakellm import FakeLLM, Responder, Text  # noqa: E402
from tests.support.workspace import make_workspace, write_session  # noqa: E402

SUMMARY = ("- [durable] The user keeps project kestrel on the Debian 12 staging server.\n"
           "- [ephemeral] The quarterly report draft is due on Thursday.")
SESSIONS = 50
QUICK_SESSIONS = 10
LATENCY_SECONDS = 0.2
CONCURRENCY = 2
RUNS = 3
CONTEXT_WINDOW = 16000
MAX_TOKENS = 1000
OVER_BUDGET = 1.5
WARM_UP_KEY = "telegram:299999"
DRAIN_TIMEOUT_SECONDS = 900.0
POLL_SECONDS = 0.25
TARGET_UTILISATION = 0.95
TARGET_TOTAL_OVER_IDEAL = 1.10
HANDOVER_STALL_MS = 50.0
# figures summarised over runs (median and min), in the order they are printed
SUMMARISED = ("llm_utilisation", "total_seconds", "ideal_seconds", "total_over_ideal", "drain_seconds",
              "first_llm_request_seconds", "handover_median_ms", "handover_stall_seconds", "llm_requests", "runs",
              "max_in_flight", "poll_errors", "daemon_cpu_seconds")


def over_budget_conversation(number: int, budget: int) -> list[dict]:
    """A conversation whose counted tokens pass OVER_BUDGET x the budget."""
    messages = nanobot_conversation(1000, tag=f"c{number}", seed=3)
    total = 0
    for index, message in enumerate(messages):
        text = sessionfile.flatten_content(message.get("content"))
        total += count_tokens(sessionfile.message_text_for_tokens(message, text))
        if total >= budget * OVER_BUDGET:
            return messages[:index + 1]
    return messages


class RequestClock:
    """Answers every archive request with a fixed summary, noting when each request arrived."""

    def __init__(self, started: float, latency: float):
        self.started = started
        self.latency = latency
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def answer(self, request: dict) -> Text:
        """The Responder body (called once the latency has passed): note the arrival, answer with fact lines."""
        with self.lock:
            self.arrivals.append(time.monotonic() - self.latency - self.started)
        return Text(SUMMARY, prompt_tokens=4000, completion_tokens=40)


def bench_burst(count: int, latency: float, concurrency: int, root: Path) -> dict:
    """*count* sessions over the budget at once, a daemon with *concurrency* LLM slots, a fake LLM at *latency*."""
    llm = LLMSettings(context_window=CONTEXT_WINDOW, max_tokens=MAX_TOKENS)
    budget = llm.context_window - llm.max_tokens - 1024
    target = int(budget * 0.5)
    workspace, sessions = make_workspace(root / "burst")
    conversations = {f"telegram:{300000 + number}": over_budget_conversation(number + 1, budget)
                     for number in range(count)}
    clock = RequestClock(time.monotonic(), latency)
    with FakeLLM(latency=latency, default=Responder(clock.answer)) as fake:
        tables = (f'[llm]\nmodel = "{fake.model}"\napi_base = "{fake.base_url}"\nconcurrency = {concurrency}\n'
                  f"context_window = {CONTEXT_WINDOW}\nmax_tokens = {MAX_TOKENS}\n"
                  '[consolidation]\nmode = "owner"\nflush = false\n')
        daemon = BenchDaemon(root / "burst-run", workspace, sessions, extra_tables=tables).start()
        try:
            daemon.wait_settled(0)
            warm_up(daemon, sessions, budget, target, clock)
            figures = _drain(daemon, sessions, conversations, target, clock)
            runs = daemon.client.get("/v1/runs", {"kind": "consolidate", "limit": 1000, "all": "true"})["runs"]
        finally:
            daemon.stop()
        runs = [run for run in runs if run["session_key"] in conversations]
        figures.update({"llm_requests": len(clock.arrivals), "max_in_flight": fake.max_in_flight,
                        "concurrency": concurrency, "latency_seconds": latency, "budget": budget,
                        "target_tokens": target})
    figures.update(_ideal(figures, clock.arrivals, latency, concurrency))
    figures.update(_handover(clock.arrivals, latency))
    figures.update(_waits_from_runs(runs, figures.pop("started_wall")))
    figures["in_flight_ok"] = figures["max_in_flight"] <= concurrency
    return figures


def warm_up(daemon: BenchDaemon, sessions: Path, budget: int, target: int, clock: RequestClock) -> None:
    """One session archived through the LLM before the burst: a daemon that has talked to its model already
    (litellm's import on the first call is not part of the burst; bench_tracker part 5 covers a cold one)."""
    key = WARM_UP_KEY
    write_session(sessions, key, over_budget_conversation(0, budget))
    deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        daemon.check_alive()
        rows = [row for row in (daemon.poll("/v1/sessions") or {}).get("sessions", []) if row["key"] == key]
        if rows and rows[0]["unarchived_tokens"] <= target and not (daemon.status() or {}).get("jobs_running"):
            break
        time.sleep(POLL_SECONDS)
    else:
        raise RuntimeError(f"the warm-up session was not archived:\n{daemon.log()[-3000:]}")
    daemon.wait_settled(1)
    with clock.lock:
        clock.arrivals.clear()
    daemon.poll_errors.clear()


def _drain(daemon: BenchDaemon, sessions: Path, conversations: dict[str, list[dict]], target: int,
           clock: RequestClock) -> dict:
    """Write every session at once, then poll the sessions list until all are under target."""
    cpu_before = cpu_seconds(daemon.proc.pid)[0]
    started_wall, started = time.time(), time.monotonic()
    clock.started = started
    for key, messages in conversations.items():
        write_session(sessions, key, messages)
    written = time.monotonic() - started
    first_archive: dict[str, float] = {}
    drained = None
    while time.monotonic() - started < DRAIN_TIMEOUT_SECONDS:
        daemon.check_alive()
        answer = daemon.poll("/v1/sessions")
        now = time.monotonic() - started
        rows = [row for row in (answer or {}).get("sessions", []) if row["key"] in conversations]
        for row in rows:
            if row["daemon_archived"] > 0:
                first_archive.setdefault(row["key"], now)
        if len(rows) == len(conversations) and all(row["unarchived_tokens"] <= target for row in rows):
            drained = now
            break
        time.sleep(POLL_SECONDS)
    if drained is None:
        raise RuntimeError(f"sessions not drained within {DRAIN_TIMEOUT_SECONDS} s:\n{daemon.log()[-3000:]}")
    waits = sorted(first_archive.values())
    return {
        "sessions": len(conversations), "started_wall": started_wall, "write_seconds": round(written, 3),
        "drain_seconds": round(drained, 2),
        "daemon_cpu_seconds": round(cpu_seconds(daemon.proc.pid)[0] - cpu_before, 2),
        "poll_errors": len(daemon.poll_errors), "poll_error_samples": daemon.poll_errors[:3],
        "polled_first_archive": {"min": round(waits[0], 2), "p50": round(statistics.median(waits), 2),
                                 "p95": round(percentile(waits, 0.95), 2), "max": round(waits[-1], 2)},
    }


def _ideal(figures: dict, arrivals: list[float], latency: float, concurrency: int) -> dict:
    """Slot utilisation, and the time taken against requests x latency / concurrency."""
    if not arrivals:
        return {"first_llm_request_seconds": None, "llm_utilisation": None, "total_seconds": None,
                "ideal_seconds": None, "total_over_ideal": None}
    last_answer = max(arrivals) + latency
    span = last_answer - min(arrivals)
    ideal = len(arrivals) * latency / concurrency
    return {"first_llm_request_seconds": round(min(arrivals), 2),
            "llm_utilisation": round(ideal / span, 3),
            "total_seconds": round(last_answer, 2), "ideal_seconds": round(ideal, 2),
            "total_over_ideal": round(last_answer / ideal, 3)}


def _handover(arrivals: list[float], latency: float) -> dict:
    """After each answer, the gap until the next request arrived (the one that took the freed slot)."""
    starts = sorted(arrivals)
    gaps = []
    for answered in sorted(arrival + latency for arrival in arrivals):
        index = bisect.bisect_left(starts, answered)
        if index < len(starts):
            gaps.append((starts[index] - answered) * 1000)
    stalls = [gap for gap in gaps if gap > HANDOVER_STALL_MS]
    return {"handover_median_ms": round(statistics.median(gaps), 1) if gaps else None,
            "handover_stalls": len(stalls), "handover_stall_seconds": round(sum(stalls) / 1000, 2)}


def _waits_from_runs(runs: list[dict], started_wall: float) -> dict:
    """Per session, when its first consolidation run started and finished (ledger times, 1 s resolution)."""
    first_started: dict[str, float] = {}
    first_finished: dict[str, float] = {}
    outcomes = Counter(run["outcome"] for run in runs)
    for run in runs:
        key = run["session_key"]
        if run["started_at"]:
            moment = datetime.fromisoformat(run["started_at"]).timestamp() - started_wall
            first_started[key] = min(first_started.get(key, moment), moment)
        if run["finished_at"] and run["state"] == "finished":
            moment = datetime.fromisoformat(run["finished_at"]).timestamp() - started_wall
            first_finished[key] = min(first_finished.get(key, moment), moment)

    def spread(values: list[float]) -> dict:
        values = sorted(values)
        if not values:
            return {}
        return {"min": round(values[0], 1), "p50": round(statistics.median(values), 1),
                "p95": round(percentile(values, 0.95), 1), "max": round(values[-1], 1)}

    return {"runs": len(runs), "run_outcomes": dict(outcomes), "ledger_first_started": spread(first_started.values()),
            "ledger_first_finished": spread(first_finished.values())}


def print_run(figures: dict) -> None:
    """One run as text."""
    polled = figures["polled_first_archive"]
    ceiling = figures["concurrency"] / figures["latency_seconds"]
    throughput = figures["llm_requests"] / figures["total_seconds"] if figures["total_seconds"] else 0.0
    print(f"   wrote {figures['sessions']} sessions in {figures['write_seconds']:.2f} s; last LLM answer after"
          f" {figures['total_seconds']} s, all seen drained after {figures['drain_seconds']:.1f} s"
          f" (daemon CPU {figures['daemon_cpu_seconds']:.1f} s)")
    print(f"   LLM: {figures['llm_requests']} requests ({throughput:.2f}/s; ceiling {ceiling:.0f}/s), first after"
          f" {figures['first_llm_request_seconds']} s; slots busy {figures['llm_utilisation'] * 100:.1f}%;"
          f" total {figures['total_seconds']} s vs ideal {figures['ideal_seconds']} s"
          f" (x{figures['total_over_ideal']}); max in flight {figures['max_in_flight']}"
          f" (concurrency {figures['concurrency']}): {'OK' if figures['in_flight_ok'] else 'EXCEEDED'}")
    print(f"   hand-over: a freed slot's next request arrived after {figures['handover_median_ms']} ms (median);"
          f" {figures['handover_stalls']} gaps over {HANDOVER_STALL_MS:.0f} ms (no request ready),"
          f" {figures['handover_stall_seconds']} s in all")
    print(f"   runs: {figures['runs']} consolidate runs, outcomes {figures['run_outcomes']};"
          f" poll errors {figures['poll_errors']} {figures['poll_error_samples'] or ''}")
    print(f"   first archive seen (polled every {POLL_SECONDS} s): min {polled['min']} s, p50 {polled['p50']} s,"
          f" p95 {polled['p95']} s, max {polled['max']} s")


def summarise(runs: list[dict]) -> tuple[dict, dict]:
    """(median, min) of each summarised figure over the runs (None where a run has no value)."""
    medians, minimums = {}, {}
    for name in SUMMARISED:
        values = [run[name] for run in runs if run.get(name) is not None]
        medians[name] = round(statistics.median(values), 3) if values else None
        minimums[name] = min(values) if values else None
    return medians, minimums


def main(argv: list[str] | None = None) -> int:
    """Run the burst --runs times, each in a fresh temporary folder and daemon; print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, help=f"sessions written at once (default {SESSIONS},"
                                                     f" {QUICK_SESSIONS} with --quick)")
    parser.add_argument("--latency", type=float, default=LATENCY_SECONDS,
                        help=f"fake LLM seconds per request (default {LATENCY_SECONDS})")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY,
                        help=f"llm.concurrency of the daemon (default {CONCURRENCY})")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"repetitions, each a fresh daemon (default {RUNS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SESSIONS} sessions, for a smoke run")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    count = args.sessions or (QUICK_SESSIONS if args.quick else SESSIONS)
    print(f"nanobotd burst benchmark: {count} sessions crossing the budget at once; fake LLM at"
          f" {args.latency * 1000:.0f} ms, concurrency {args.concurrency}, {args.runs} run(s), {os.cpu_count()} CPUs")
    runs = []
    for number in range(args.runs):
        print(f"\nrun {number + 1} of {args.runs}")
        with tempfile.TemporaryDirectory(prefix="nanobotd-bench-burst-") as folder:
            figures = bench_burst(count, args.latency, args.concurrency, Path(folder))
        print_run(figures)
        runs.append(figures)
    medians, minimums = summarise(runs)
    if args.runs > 1:
        print(f"\nover {args.runs} runs (median / min):")
        for name in SUMMARISED:
            print(f"   {name:28} {medians[name]!s:>10} / {minimums[name]!s:>10}")
    utilisation, ratio = medians["llm_utilisation"], medians["total_over_ideal"]
    print(f"\nslots busy (median) {utilisation}: goal >= {TARGET_UTILISATION}"
          f" {verdict(utilisation is not None and utilisation >= TARGET_UTILISATION)};"
          f" total / ideal (median) {ratio}: goal <= {TARGET_TOTAL_OVER_IDEAL}"
          f" {verdict(ratio is not None and ratio <= TARGET_TOTAL_OVER_IDEAL)};"
          f" poll errors {sum(run['poll_errors'] for run in runs)}")
    figures = {"sizes": {"burst_sessions": count, "latency_seconds": args.latency, "concurrency": args.concurrency,
                         "runs": args.runs},
               "burst": dict(medians, sessions=count, in_flight_ok=all(run["in_flight_ok"] for run in runs)),
               "burst_min": minimums, "burst_runs": runs}
    save_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
