#!/usr/bin/env python3
"""Retrieval benchmark on LoCoMo: does search find the turns that answer a question, in few words, fast?

For each conversation a temporary workspace holds one nanobot session file per LoCoMo session (nanobot's
base64 file names, real session dates, speaker A as `user`, B as `assistant`, the speaker's name in
`name`, an image by its caption). Every question goes through the same search the daemon serves; a hit
covers the dia_ids of its messages (with --history observations also history facts). Categories 1-4:
  R@k    percent of questions with ANY evidence id inside the top k hits;  MRR of the first such hit
  W@10   words in the text of the top 10 hits;  p50/p95  milliseconds per question
  R@1kw  percent of questions with evidence inside the hits that fit in the first 1,000 words (WORD_BUDGET):
         recall at what an agent can afford to read, comparable across rankings that show more or less
Printed: the lexical figure with the shipped defaults; the honest 2-fold estimate (conversations split in
two halves; on each half the grid of window sizes and reranker weights is tuned for R@10 within 1,000
words, and the other half is measured; the two held-out halves merged); each mode (builtin, qmd, both,
builtin+embeddings) with its latency; and plain bm25 over single turns as a baseline. --chat sends each
turn as one message a sentence, the way people write in chat apps: a second set from the same conversations.

    scripts/bench_locomo.py --data ../shared/bench-data/locomo/locomo-dev.json [--chat] [--qmd PATH] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanobotd.config.schema import LLMSettings, QmdSettings  # noqa: E402
from nanobotd.daemon.handlers.search import fuse  # noqa: E402
from nanobotd.index import rerank  # noqa: E402
from nanobotd.index.builtin import BuiltinIndex  # noqa: E402
from nanobotd.index.qmd import QmdBackend  # noqa: E402
from nanobotd.index.qmdexport import QmdExport  # noqa: E402
from nanobotd.index.query import parse_query, quote  # noqa: E402
from nanobotd.index.sessionunits import STRIDE, WINDOW  # noqa: E402
from nanobotd.index.sources import SourceSet  # noqa: E402
from nanobotd.llm.embeddings import Embedder  # noqa: E402
from nanobotd.sessions.file import filename_for_key  # noqa: E402

DIA_ID = re.compile(r"D(\d+):(\d+)")
SESSION_KEY = re.compile(r"^session_(\d+)$")
DATE_FORMAT = "%I:%M %p on %d %B, %Y"
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
TURN_SECONDS = 30
TOP = 10
HEADLINE = (1, 2, 3, 4)
WORD_BUDGET = 1000  # words in the top 10 a tuned setting may use


def load_conversations(path: Path, chat: bool = False) -> list[dict]:
    """LoCoMo conversations as {id, speakers, sessions: [{number, date, turns}], questions}; with *chat* each
    turn is sent as one message a sentence, as people write in chat apps (each keeps the turn's dia_id)."""
    conversations = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        conversation = sample["conversation"]
        numbers = sorted(int(match.group(1)) for match in map(SESSION_KEY.match, conversation) if match)
        sessions = []
        for number in numbers:
            stamp = conversation.get(f"session_{number}_date_time", "")
            turns = conversation[f"session_{number}"]
            sessions.append({"number": number, "date": _session_date(stamp),
                             "turns": [piece for turn in turns for piece in _sentences(turn)] if chat else turns})
        questions = []
        for qa in sample["qa"]:
            evidence = {f"D{int(a)}:{int(b)}" for item in qa.get("evidence", []) for a, b in DIA_ID.findall(str(item))}
            if evidence:
                questions.append({"question": qa["question"], "category": int(qa["category"]), "evidence": evidence})
        conversations.append({"id": sample.get("sample_id", f"conv-{len(conversations)}"),
                              "speakers": (conversation["speaker_a"], conversation["speaker_b"]),
                              "sessions": sessions, "questions": questions,
                              "observations": sample.get("observation", {})})
    return conversations


def _sentences(turn: dict) -> list[dict]:
    """A turn as one message per sentence (an image's caption goes with the last)."""
    pieces = [piece for piece in SENTENCE_END.split(turn.get("text", "")) if piece.strip()] or [""]
    return [{**turn, "text": piece, "blip_caption": turn.get("blip_caption") if last else None}
            for last, piece in ((index == len(pieces) - 1, piece) for index, piece in enumerate(pieces))]


def _session_date(text: str) -> datetime:
    try:
        return datetime.strptime(text.strip(), DATE_FORMAT)
    except ValueError:
        return datetime(2000, 1, 1)


def turn_text(turn: dict) -> str:
    """A turn's words as the agent would have seen them (an image by its caption)."""
    text = turn.get("text", "")
    if turn.get("blip_caption"):
        text += f" [shared a photo: {turn['blip_caption']}]"
    return text


def write_sessions(conversation: dict, sessions_dir: Path) -> dict[str, list[str]]:
    """One nanobot session file per LoCoMo session; return session key -> dia_id per message position."""
    sessions_dir.mkdir(parents=True, exist_ok=True)
    speaker_a = conversation["speakers"][0]
    layout = {}
    for session in conversation["sessions"]:
        key = f"locomo:{conversation['id']}-{session['number']}"
        start = session["date"]
        stamps = [(start + timedelta(seconds=TURN_SECONDS * index)).isoformat()
                  for index in range(len(session["turns"]))]
        header = {"_type": "metadata", "key": key, "created_at": stamps[0] if stamps else start.isoformat(),
                  "updated_at": stamps[-1] if stamps else start.isoformat(), "metadata": {},
                  "last_archived": 0, "last_consolidated": 0}
        lines = [json.dumps(header, ensure_ascii=False)]
        for turn, stamp in zip(session["turns"], stamps, strict=True):
            role = "user" if turn["speaker"] == speaker_a else "assistant"
            lines.append(json.dumps({"role": role, "name": turn["speaker"], "content": turn_text(turn),
                                     "timestamp": stamp, "dia_id": turn["dia_id"]}, ensure_ascii=False))
        (sessions_dir / filename_for_key(key)).write_text("\n".join(lines) + "\n", encoding="utf-8")
        layout[key] = [turn["dia_id"] for turn in session["turns"]]
    return layout


def write_history(conversation: dict, memory_dir: Path) -> dict[str, str]:
    """history.jsonl with one entry of fact lines per session, from LoCoMo's observations (the kind of
    summary nanobot's consolidation writes); return fact line -> dia_id."""
    facts: dict[str, str] = {}
    lines = []
    for session in conversation["sessions"]:
        observed = conversation["observations"].get(f"session_{session['number']}_observation", {})
        entry = []
        for items in observed.values():
            for item in items:
                if isinstance(item, list) and len(item) >= 2:
                    dia = item[1][0] if isinstance(item[1], list) and item[1] else item[1]
                    line = f"- [durable] {item[0]}"
                    facts[line.strip()] = str(dia)
                    entry.append(line)
        if entry:
            key = f"locomo:{conversation['id']}-{session['number']}"
            stamp = session["date"].strftime("%Y-%m-%d %H:%M")
            lines.append(json.dumps({"cursor": session["number"], "timestamp": stamp,
                                     "content": "\n".join(entry), "session_key": key}, ensure_ascii=False))
    memory_dir.mkdir(parents=True, exist_ok=True)
    (memory_dir / "history.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return facts


def covered_ranking(hits, layout: dict[str, list[str]], facts: dict[str, str]) -> list[tuple[set, int]]:
    """(dia_ids, words) of hits: a session hit covers its messages, a history hit the facts it shows."""
    ranked = []
    for hit in hits[:TOP]:
        if hit.source == "history":
            covered = {facts[line.strip()] for line in hit.text.splitlines() if line.strip() in facts}
        else:
            dia_ids = layout.get(hit.session_key or "", [])
            covered = set(dia_ids[hit.message_start:hit.message_end + 1]) if hit.message_start is not None else set()
        ranked.append((covered, len(hit.text.split())))
    return ranked


def all_turns(conversation: dict) -> list[tuple[str, str]]:
    """(dia_id, "Speaker: text") of every turn, in conversation order."""
    return [(turn["dia_id"], f"{turn['speaker']}: {turn_text(turn)}")
            for session in conversation["sessions"] for turn in session["turns"]]


class TurnBM25:
    """Plain FTS5 bm25 over single turns: the baseline the windows have to beat."""

    def __init__(self, turns: list[tuple[str, str]]):
        self.connection = sqlite3.connect(":memory:")
        self.connection.execute(
            "CREATE VIRTUAL TABLE turns USING fts5(dia_id UNINDEXED, body, tokenize='porter unicode61')")
        self.connection.executemany("INSERT INTO turns VALUES (?, ?)", turns)

    def ranking(self, question: str) -> list[tuple[set, int]]:
        terms = parse_query(question).terms
        if not terms:
            return []
        rows = self.connection.execute(
            "SELECT dia_id, body FROM turns WHERE turns MATCH ? ORDER BY bm25(turns) LIMIT ?",
            (" OR ".join(quote(term) for term in terms), TOP)).fetchall()
        return [({dia_id}, len(body.split())) for dia_id, body in rows]


class Scores:
    """R@5, R@10, MRR and W@10 per category, and the time each question took."""

    def __init__(self):
        self.rows: dict[int, list[tuple[bool, bool, float, int, bool]]] = defaultdict(list)
        self.seconds: list[float] = []

    def add(self, category: int, evidence: set, ranked: list[tuple[set, int]], seconds: float = 0.0) -> None:
        first = next((rank for rank, (ids, _) in enumerate(ranked[:TOP], start=1) if ids & evidence), None)
        words = sum(count for _, count in ranked[:TOP])
        affordable = sum(1 for _ in itertools.takewhile(lambda total: total <= WORD_BUDGET, itertools.accumulate(
            count for _, count in ranked[:TOP])))
        self.rows[category].append((first is not None and first <= 5, first is not None,
                                    1 / first if first else 0.0, words, first is not None and first <= affordable))
        self.seconds.append(seconds)

    def merge(self, other: Scores) -> Scores:
        for category, rows in other.rows.items():
            self.rows[category].extend(rows)
        self.seconds.extend(other.seconds)
        return self

    def summary(self, categories=HEADLINE) -> dict:
        rows = [row for category in categories for row in self.rows.get(category, [])]
        if not rows:
            return {"R@5": 0.0, "R@10": 0.0, "MRR": 0.0, "W@10": 0.0, "R@1kw": 0.0, "questions": 0}
        count = len(rows)
        ordered = sorted(self.seconds) or [0.0]
        return {"R@5": round(100 * sum(r[0] for r in rows) / count, 1),
                "R@10": round(100 * sum(r[1] for r in rows) / count, 1),
                "MRR": round(sum(r[2] for r in rows) / count, 3), "W@10": round(sum(r[3] for r in rows) / count, 1),
                "R@1kw": round(100 * sum(r[4] for r in rows) / count, 1),
                "questions": count, "p50_ms": round(1000 * statistics.median(ordered), 2),
                "p95_ms": round(1000 * ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 2)}


@dataclass(frozen=True)
class Config:
    """One setting of the knobs the 2-fold estimate tunes: window sizes and the reranker's two weights."""

    window: int = WINDOW
    stride: int = STRIDE
    part_weight: float = rerank.PART_WEIGHT
    coverage_share: float = rerank.COVERAGE_SHARE


DEFAULT = Config()
GRID = [Config(window, stride, part, coverage) for window, stride in ((800, 400), (600, 300), (1000, 500))
        for part in (0.0, 0.5, 1.0) for coverage in (0.0, 0.5, 1.0)]


@contextlib.contextmanager
def prepared(conversation: dict, history: bool):
    """A temporary workspace holding the conversation as nanobot session files (and history)."""
    with tempfile.TemporaryDirectory(prefix="locomo-") as tmp:
        root = Path(tmp)
        (root / "workspace" / "memory").mkdir(parents=True)
        layout = write_sessions(conversation, root / "sessions")
        facts = write_history(conversation, root / "workspace" / "memory") if history else {}
        yield root, layout, facts


def asked_at(conversation: dict) -> datetime:
    """When the questions are asked: the day after the last session (what "last week" is relative to)."""
    return max(session["date"] for session in conversation["sessions"]) + timedelta(days=1)


def run_builtin(conversation: dict, configs: list[Config], history: bool, embed=None) -> dict[Config, Scores]:
    """Every question through BuiltinIndex.search for each config (one index per window size)."""
    results = {}
    for (window, stride), group in itertools.groupby(sorted(configs, key=lambda c: (c.window, c.stride)),
                                                     key=lambda c: (c.window, c.stride)):
        with prepared(conversation, history) as (root, layout, facts):
            index = BuiltinIndex(root / "workspace", root / "state" / "index.db", root / "sessions",
                                 clock=lambda: asked_at(conversation), window=window, stride=stride, embed=embed)
            index.refresh()
            for config in group:
                rerank.PART_WEIGHT, rerank.COVERAGE_SHARE = config.part_weight, config.coverage_share
                scores = results[config] = Scores()
                for question in conversation["questions"]:
                    started = time.perf_counter()
                    hits = index.search(question["question"], limit=TOP)
                    elapsed = time.perf_counter() - started
                    scores.add(question["category"], question["evidence"], covered_ranking(hits, layout, facts),
                               elapsed)
            index.close()
    rerank.PART_WEIGHT, rerank.COVERAGE_SHARE = DEFAULT.part_weight, DEFAULT.coverage_share
    return results


def two_fold(per_conversation: dict[str, dict[Config, Scores]]) -> tuple[Scores, list[dict]]:
    """Tune on one half of the conversations, measure on the other, both ways; the held-out scores merged."""
    ids = sorted(per_conversation)
    folds = [ids[0::2], ids[1::2]]
    held_out, choices = Scores(), []
    for tune, test in (folds, folds[::-1]):
        tuned = {config: merged(per_conversation, config, tune).summary() for config in GRID}
        best = max(GRID, key=lambda config: (tuned[config]["W@10"] <= WORD_BUDGET, tuned[config]["R@10"],
                                             -tuned[config]["W@10"]))
        measured = merged(per_conversation, best, test)
        held_out.merge(measured)
        choices.append({"tuned_on": tune, "tested_on": test, "config": dataclasses.asdict(best),
                        "held_out": measured.summary()})
    return held_out, choices


def merged(per_conversation: dict[str, dict[Config, Scores]], config: Config, names: list[str]) -> Scores:
    """The scores of *config* over the conversations *names*, as one."""
    return functools.reduce(Scores.merge, (per_conversation[name][config] for name in names), Scores())


async def run_qmd(conversation: dict, qmd: str, history: bool) -> tuple[Scores, Scores]:
    """Every question through the QMD backend (markdown export of the sessions), and fused with builtin."""
    qmd_scores, both_scores = Scores(), Scores()
    with prepared(conversation, history) as (root, layout, facts):
        workspace, sessions = root / "workspace", root / "sessions"
        index = BuiltinIndex(workspace, root / "state" / "index.db", sessions, clock=lambda: asked_at(conversation))
        index.refresh()
        export = QmdExport(root / "state" / "export", SourceSet(workspace, [sessions]))
        environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root / "home"), "CI": "true"}
        backend = QmdBackend(workspace, root / "state" / "qmd", QmdSettings(command=qmd, timeout_seconds=30),
                             environ=environ, export=export)
        await backend.start()
        try:
            await backend.update_now()
            await backend.warm_up()
            for question in conversation["questions"]:
                started = time.perf_counter()
                hits = await backend.search(question["question"], limit=TOP)
                middle = time.perf_counter()
                fused = fuse(hits, index.search(question["question"], limit=TOP), TOP)
                ended = time.perf_counter()
                qmd_scores.add(question["category"], question["evidence"], covered_ranking(hits, layout, facts),
                               middle - started)
                both_scores.add(question["category"], question["evidence"], covered_ranking(fused, layout, facts),
                                ended - started)
        finally:
            await backend.close()
            index.close()
    return qmd_scores, both_scores


def run(args: argparse.Namespace) -> dict:
    """Index every conversation, ask every question in every mode; return the report."""
    conversations = load_conversations(args.data, args.chat)[:args.limit_conversations or None]
    history = args.history == "observations"
    per_conversation = {conversation["id"]: run_builtin(conversation, [DEFAULT] if args.quick else GRID, history)
                        for conversation in conversations}
    lexical = functools.reduce(Scores.merge, (runs[DEFAULT] for runs in per_conversation.values()), Scores())
    held_out, choices = (lexical, []) if args.quick else two_fold(per_conversation)
    baseline = Scores()
    for conversation in conversations:
        turns = TurnBM25(all_turns(conversation))
        for question in conversation["questions"]:
            baseline.add(question["category"], question["evidence"], turns.ranking(question["question"]))
    modes = {"builtin": lexical.summary(), "bm25_turns": baseline.summary()}
    if args.qmd:
        pairs = [asyncio.run(run_qmd(conversation, args.qmd, history)) for conversation in conversations]
        modes["qmd"] = functools.reduce(Scores.merge, (pair[0] for pair in pairs), Scores()).summary()
        modes["both"] = functools.reduce(Scores.merge, (pair[1] for pair in pairs), Scores()).summary()
    else:
        modes["qmd"] = modes["both"] = "skipped: no --qmd given"
    if args.embeddings:
        embedder = Embedder(args.embeddings, LLMSettings(api_base=args.api_base or ""),
                            os.environ.get("OPENAI_API_KEY"))
        runs = [run_builtin(conversation, [DEFAULT], history, embedder.embed)[DEFAULT]
                for conversation in conversations]
        modes["builtin+embeddings"] = functools.reduce(Scores.merge, runs, Scores()).summary()
    else:
        modes["builtin+embeddings"] = "skipped: no --embeddings model given (none is reachable offline)"
    return {"lexical": lexical.summary(), "per_category": {str(c): lexical.summary([c]) for c in sorted(lexical.rows)},
            "two_fold": {"held_out": held_out.summary(), "folds": choices}, "modes": modes,
            "settings": {"conversations": [c["id"] for c in conversations], "top": TOP, "word_budget": WORD_BUDGET,
                         "default": dataclasses.asdict(DEFAULT), "grid": len(GRID), "history": args.history,
                         "chat": args.chat}}


def line(name: str, row: dict | str, width: int = 22) -> str:
    """One row of a report table (or the reason a mode was skipped)."""
    if isinstance(row, str):
        return f"{name:<{width}} {row}"
    return (f"{name:<{width}} R@5 {row['R@5']:5.1f}  R@10 {row['R@10']:5.1f}  MRR {row['MRR']:.3f}  "
            f"W@10 {row['W@10']:7.1f}  R@1kw {row['R@1kw']:5.1f}  "
            f"p50 {row.get('p50_ms', 0):6.2f} ms  p95 {row.get('p95_ms', 0):6.2f} ms  "
            f"n={row['questions']}")


def print_report(report: dict) -> None:
    """A readable table of the report."""
    settings = report["settings"]
    print(f"LoCoMo retrieval, {len(settings['conversations'])} conversations, categories 1-4, top {settings['top']}, "
          f"history: {settings['history']}{', chat messages' if settings['chat'] else ''}, "
          f"defaults {settings['default']}")
    print(line("lexical (defaults)", report["lexical"]))
    for category, row in report["per_category"].items():
        print(line(f"  category {category}", row))
    print(line("2-fold held-out", report["two_fold"]["held_out"]))
    for fold in report["two_fold"]["folds"]:
        print(f"  tuned on {','.join(fold['tuned_on'])}: {fold['config']} -> held-out "
              f"R@10 {fold['held_out']['R@10']} W@10 {fold['held_out']['W@10']}")
    for name, row in report["modes"].items():
        print(line(f"mode {name}", row))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="locomo JSON (never copied into the repo)")
    parser.add_argument("--json", type=Path, help="write the report as JSON to this file")
    parser.add_argument("--limit-conversations", type=int, help="only the first N conversations")
    parser.add_argument("--history", choices=("none", "observations"), default="none",
                        help="also index history.jsonl entries made of LoCoMo's per-session observations")
    parser.add_argument("--chat", action="store_true",
                        help="send each turn as one message a sentence (short chat messages)")
    parser.add_argument("--quick", action="store_true",
                        help="the defaults only: no 2-fold grid (its line then repeats the defaults)")
    parser.add_argument("--qmd", help="qmd executable: also run the qmd and both modes")
    parser.add_argument("--embeddings", help="litellm embedding model: also run builtin+embeddings")
    parser.add_argument("--api-base", help="OpenAI-compatible base URL for --embeddings")
    args = parser.parse_args(argv)
    report = run(args)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
