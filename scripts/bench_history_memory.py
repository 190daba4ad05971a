#!/usr/bin/env python3
"""Peak memory of what nanobotd does with a large history.jsonl: nothing may hold the whole file.

On a fresh history of --entries entries of --content-chars characters (~50 MB either way by default:
6,000 long entries, or --many: 100,000 short ones), each operation's peak of Python allocations
(tracemalloc, over what was allocated before it) and its wall time: the compaction's candidates and the
compaction itself, the recovery of a consolidation that died after its append, the archive marks rebuilt
from the history's spans, the dream's backlog after .dream_cursor, and the audit. Every operation runs once
on a small history first (imports and caches are not counted). Median and min of --runs runs.

    scripts/bench_history_memory.py [--entries N] [--content-chars N] [--many] [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_daemon import save_figures  # noqa: E402
from loguru import logger  # noqa: E402

from tests.support.bighistory import CONTENT_CHARS, ENTRIES, measure  # noqa: E402

MANY_ENTRIES, MANY_CONTENT_CHARS = 100_000, 450  # ~510 bytes a line: ~50 MB


def main(argv: list[str] | None = None) -> int:
    """Run the measure --runs times and print median and min of each operation's peak."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=None)
    parser.add_argument("--content-chars", type=int, default=None)
    parser.add_argument("--many", action="store_true", help="100,000 short entries instead of 6,000 long ones")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    entries = args.entries or (MANY_ENTRIES if args.many else ENTRIES)
    content_chars = args.content_chars or (MANY_CONTENT_CHARS if args.many else CONTENT_CHARS)
    logger.remove()
    print(f"history memory benchmark: {entries} entries of {content_chars} characters, {args.runs} runs,"
          f" {os.cpu_count()} CPUs")
    peaks: dict[str, list[int]] = {}
    seconds: dict[str, list[float]] = {}
    size = 0
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="nbd-bench-history-") as folder:
            started = time.perf_counter()
            size, measured = measure(Path(folder), entries, content_chars)
            print(f"  run: {time.perf_counter() - started:.1f} s")
        for name, (_, peak, elapsed) in measured.items():
            peaks.setdefault(name, []).append(peak)
            seconds.setdefault(name, []).append(elapsed)
    print(f"history.jsonl: {size / 1e6:.1f} MB")
    print(f"{'operation':24s} {'peak MB (median, min)':>24s} {'seconds (median, min)':>24s}")
    figures = {"history_bytes": size, "entries": entries, "content_chars": content_chars, "operations": {}}
    for name, values in peaks.items():
        figures["operations"][name] = {"peak_bytes_median": statistics.median(values), "peak_bytes_min": min(values),
                                       "seconds_median": statistics.median(seconds[name]),
                                       "seconds_min": min(seconds[name])}
        print(f"{name:24s} {statistics.median(values) / 1e6:15.2f} {min(values) / 1e6:8.2f}"
              f" {statistics.median(seconds[name]):15.2f} {min(seconds[name]):8.2f}")
    save_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
