#!/usr/bin/env python3
"""One table of every benchmark figure against its goal, from the JSON the benchmark scripts save.

    scripts/bench_table.py RUNS_DIR [--json TABLE.json]        the table of one set of runs
    scripts/bench_table.py --compare BEFORE.json AFTER.json     two tables side by side

RUNS_DIR holds `<bench>-<n>.json` files, one per run (what scripts/bench_all.sh saves): consolidate,
burst, search, tracker. Figures are named without sizes: the sizes each benchmark ran at are listed
under the table (the goals are those of the full sizes). For each figure the table shows its goal, the
median and the min over the runs, the unit, and whether the median meets the goal. A figure whose script
or key is absent (a benchmark that failed, or that does not report that figure yet) shows as "missing",
never as a failure of this script.
Where each figure is read from is said once, in FIGURES below.
"""

from __future__ import annotations

import argparse
import json
import operator
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

MISSING = "missing"
TOP_LEVEL_SIZES = ("history_entries", "sessions")
RUN_FILE = re.compile(r"^(?P<bench>[a-z_]+)-(?P<run>\d+)\.json$")
GOALS = {">=": operator.ge, "<=": operator.le, "<": operator.lt, ">": operator.gt, "==": operator.eq}


@dataclass(frozen=True)
class Figure:
    """One row: where its value is (bench file and dotted keys, the first present wins) and its goal."""

    name: str
    bench: str
    keys: tuple[str, ...]
    goal: str  # an operator of GOALS and a number: ">= 20000"
    unit: str
    scale: float = 1.0  # applied to the raw value (a share shown in %)

    def met(self, value: float) -> bool:
        op, _, number = self.goal.partition(" ")
        return GOALS[op](value, float(number))


FIGURES = (
    Figure("offline consolidation (scan + archive)", "consolidate", ("offline.end_to_end_messages_per_second",),
           ">= 20000", "msgs/s"),
    Figure("offline consolidation, peak RSS", "consolidate", ("offline.vm_hwm_mb",), "<= 150", "MB"),
    Figure("offline consolidation, peak memory with any child (sampled)", "consolidate",
           ("offline.with_counting_process_peak_rss_mb",), "<= 150", "MB"),
    Figure("consolidation through the daemon", "consolidate",
           ("daemon.end_to_end_messages_per_second",), ">= 20000", "msgs/s"),
    # for scale: the least work raw archiving takes in one pass; a goal above it cannot be met by any pipeline
    Figure("the floor of raw archiving (one pass, no spool, journal or backups)", "consolidate",
           ("floor.messages_per_second",), ">= 20000", "msgs/s"),
    Figure("consolidation through the daemon, peak RSS", "consolidate", ("daemon.vm_hwm_mb",), "<= 150", "MB"),
    Figure("consolidation through the daemon, peak memory with its children (sampled)", "consolidate",
           ("daemon.with_children_peak_rss_mb",), "<= 150", "MB"),
    Figure("a save that is not an append (checkpoint, /new), daemon peak RSS", "consolidate",
           ("rewrite.vm_hwm_mb",), "<= 150", "MB"),
    Figure("builtin search p95", "search", ("builtin.p95_ms",), "< 10", "ms"),
    Figure("builtin search p99", "search", ("builtin.p99_ms",), "< 20", "ms"),
    Figure("cold start", "tracker", ("cold_start.cold_start_seconds",), "<= 3", "s"),
    Figure("cold start RSS", "tracker", ("cold_start.cold_start_vm_rss_mb",), "<= 100", "MB"),
    Figure("cold start peak memory, daemon and any child (sampled)", "tracker",
           ("cold_start.cold_start_together_peak_mb", "cold_start.cold_start_total_vm_hwm_mb"), "<= 100", "MB"),
    Figure("idle RSS", "tracker", ("idle.vm_rss_mb",), "< 60", "MB"),
    Figure("RSS after the last LLM call (5 min)", "tracker", ("llm_idle.total_mb",), "< 60", "MB"),
    Figure("burst: LLM slots busy", "burst", ("burst.llm_utilisation",), ">= 95", "%", scale=100.0),
    Figure("burst: total / ideal time", "burst", ("burst.total_over_ideal",), "<= 1.10", "x"),
    Figure("burst: errors from GET /v1/sessions", "burst", ("burst.poll_errors",), "== 0", "count"),
)


def dig(data: dict, dotted: str):
    """data["a"]["b"] for "a.b"; None when any step is absent or not a number at the end."""
    value = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def load_runs(folder: Path) -> dict[str, list[dict]]:
    """Every `<bench>-<n>.json` of *folder*, by bench, in run order (unreadable files are left out)."""
    runs: dict[str, list[tuple[int, dict]]] = {}
    for path in sorted(folder.iterdir()):
        match = RUN_FILE.match(path.name)
        if not match:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            runs.setdefault(match["bench"], []).append((int(match["run"]), data))
    return {bench: [data for _, data in sorted(items, key=lambda item: item[0])] for bench, items in runs.items()}


def build_table(runs: dict[str, list[dict]]) -> dict:
    """The rows (figure, goal, median, min, unit, runs, pass or missing) and the sizes each bench ran at."""
    rows = []
    for figure in FIGURES:
        values = []
        for data in runs.get(figure.bench, []):
            found = next((value for key in figure.keys if (value := dig(data, key)) is not None), None)
            if found is not None:
                values.append(found * figure.scale)
        row = {"figure": figure.name, "goal": figure.goal, "unit": figure.unit, "runs": len(values),
               "median": None, "min": None, "result": MISSING}
        if values:
            median = statistics.median(values)
            row.update(median=round(median, 3), min=round(min(values), 3),
                       result="pass" if figure.met(median) else "fail")
        rows.append(row)
    sizes = {bench: sizes_of(items[0]) for bench, items in sorted(runs.items()) if items}
    return {"rows": rows, "sizes": sizes}


def sizes_of(data: dict) -> dict:
    """What a run's sizes were: its "sizes" object, else the top-level size keys bench_search writes."""
    if isinstance(data.get("sizes"), dict):
        return data["sizes"]
    return {key: data[key] for key in TOP_LEVEL_SIZES if key in data}


def number(value) -> str:
    """A figure for the text table: missing, or up to 3 significant decimals."""
    if value is None:
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def render(table: dict) -> str:
    """The table as aligned text, then the sizes each benchmark ran at."""
    lines = [("figure", "goal", "median", "min", "unit", "result")]
    for row in table["rows"]:
        lines.append((row["figure"], row["goal"], number(row["median"]), number(row["min"]), row["unit"],
                      row["result"]))
    return _align(lines) + "\n" + "\n".join(f"sizes {bench}: {json.dumps(sizes)}"
                                            for bench, sizes in table["sizes"].items())


def compare(before: dict, after: dict) -> str:
    """Two tables side by side, row by row (a figure only one of them has shows as missing in the other)."""
    earlier = {row["figure"]: row for row in before["rows"]}
    lines = [("figure", "goal", "before", "after", "unit", "before", "after")]
    for row in after["rows"]:
        old = earlier.get(row["figure"], {})
        lines.append((row["figure"], row["goal"], number(old.get("median")), number(row["median"]), row["unit"],
                      old.get("result", MISSING), row["result"]))
    for name, old in earlier.items():
        if not any(row["figure"] == name for row in after["rows"]):
            lines.append((name, old["goal"], number(old["median"]), MISSING, old["unit"], old["result"], MISSING))
    return _align(lines)


def _align(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    text = ["  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                      for column, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip()
            for line in lines]
    return "\n".join([text[0], "-" * len(text[0]), *text[1:]])


def main(argv: list[str] | None = None) -> int:
    """Build (and save) the table of one runs folder, or compare two saved tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=Path, help="folder of <bench>-<n>.json run files")
    parser.add_argument("--json", type=Path, help="write the table as JSON to this file")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="print two saved tables (--json files) side by side")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(path.read_text(encoding="utf-8")) for path in args.compare)
        print(f"before: {args.compare[0]}\nafter:  {args.compare[1]}\n")
        print(compare(before, after))
        return 0
    if args.runs is None or not args.runs.is_dir():
        parser.error("give a folder of run files, or --compare BEFORE.json AFTER.json")
    table = build_table(load_runs(args.runs))
    table["runs_dir"] = str(args.runs)
    print(render(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
        print(f"\ntable written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
