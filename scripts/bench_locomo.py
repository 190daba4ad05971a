#!/usr/bin/env python3
"""Retrieval benchmark on LoCoMo: does the builtin index find the turns that answer a question?

For each conversation a temporary workspace is built with one nanobot session file per LoCoMo session
(file name = nanobot's base64 of the session key, real session dates in the message timestamps,
speaker A as `user`, speaker B as `assistant`, the speaker's name in `name`, an image's caption as
text, the LoCoMo `dia_id` kept as an extra field of each message record). The real BuiltinIndex
indexes it, and every question goes through the same `BuiltinIndex.search` the daemon serves. A hit
covers the dia_ids of the messages in its range (session key + message_start..message_end).

Metrics (per category 1-5 and over categories 1-4):
  R@k   percent of questions with ANY of their evidence dia_ids inside the top k hits
  MRR   mean reciprocal rank of the first hit holding an evidence id (0 when none in the top 10)
  W@10  mean number of words (whitespace-separated) in the text of the top 10 hits
Questions whose evidence holds no valid id (after normalising with D(\\d+):(\\d+)) are skipped.

With --history observations, memory/history.jsonl also gets one entry per session made of LoCoMo's
observation facts (the kind of fact lines nanobot's consolidation writes); a history hit covers the
dia_ids of the facts it shows. The headline numbers are without it (transcripts only).

Baselines from the same run, over the same turns and the same query words:
  grep_turns  turns containing any query word, ranked by how many distinct words they contain
  bm25_turns  SQLite FTS5 bm25 over single turns (porter stemming, query words OR-ed)

    scripts/bench_locomo.py --data ../shared/bench-data/locomo/locomo-dev.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanobotd.index.builtin import BuiltinIndex  # noqa: E402
from nanobotd.index.query import parse_query, quote  # noqa: E402
from nanobotd.index.sessionunits import STRIDE, WINDOW  # noqa: E402
from nanobotd.sessions.file import filename_for_key  # noqa: E402

DIA_ID = re.compile(r"D(\d+):(\d+)")
SESSION_KEY = re.compile(r"^session_(\d+)$")
DATE_FORMAT = "%I:%M %p on %d %B, %Y"
TURN_SECONDS = 30
TOP = 10
HEADLINE = (1, 2, 3, 4)


def load_conversations(path: Path) -> list[dict]:
    """LoCoMo conversations as {id, speakers, sessions: [{number, date, turns}], questions}."""
    conversations = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        conversation = sample["conversation"]
        numbers = sorted(int(match.group(1)) for match in map(SESSION_KEY.match, conversation) if match)
        sessions = []
        for number in numbers:
            stamp = conversation.get(f"session_{number}_date_time", "")
            sessions.append({"number": number, "date": _session_date(stamp),
                             "turns": conversation[f"session_{number}"]})
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


def builtin_ranking(index: BuiltinIndex, layout: dict[str, list[str]], facts: dict[str, str],
                    question: str) -> list[tuple[set, int]]:
    """(dia_ids, words) of the index's top hits: a session window covers its messages, a history
    entry the facts it shows."""
    ranked = []
    for hit in index.search(question, limit=TOP):
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


def grep_ranking(turns: list[tuple[str, str]], question: str) -> list[tuple[set, int]]:
    """Turns containing any query word, most distinct words first (conversation order on ties)."""
    terms = parse_query(question).terms
    patterns = [re.compile(rf"\b{re.escape(term)}\b", re.IGNORECASE) for term in terms]
    scored = []
    for order, (dia_id, text) in enumerate(turns):
        matched = sum(1 for pattern in patterns if pattern.search(text))
        if matched:
            scored.append((-matched, order, dia_id, text))
    scored.sort()
    return [({dia_id}, len(text.split())) for _, _, dia_id, text in scored[:TOP]]


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
    """Accumulates R@5, R@10, MRR and W@10 per category."""

    def __init__(self):
        self.rows: dict[int, list[tuple[bool, bool, float, int]]] = defaultdict(list)

    def add(self, category: int, evidence: set, ranked: list[tuple[set, int]]) -> None:
        first = next((rank for rank, (ids, _) in enumerate(ranked[:TOP], start=1) if ids & evidence), None)
        words = sum(count for _, count in ranked[:TOP])
        self.rows[category].append((first is not None and first <= 5, first is not None,
                                    1 / first if first else 0.0, words))

    def summary(self, categories) -> dict:
        rows = [row for category in categories for row in self.rows.get(category, [])]
        if not rows:
            return {"R@5": 0.0, "R@10": 0.0, "MRR": 0.0, "W@10": 0.0, "questions": 0}
        count = len(rows)
        return {"R@5": round(100 * sum(r[0] for r in rows) / count, 1),
                "R@10": round(100 * sum(r[1] for r in rows) / count, 1),
                "MRR": round(sum(r[2] for r in rows) / count, 3), "W@10": round(sum(r[3] for r in rows) / count, 1),
                "questions": count}


def run(data: Path, limit: int | None, window: int, stride: int, history: bool = False) -> dict:
    """Index every conversation, ask every question; return the report."""
    conversations = load_conversations(data)[:limit] if limit else load_conversations(data)
    builtin, grep, bm25 = Scores(), Scores(), Scores()
    timings = {"index_seconds": 0.0, "search_seconds": 0.0, "questions": 0}
    for conversation in conversations:
        with tempfile.TemporaryDirectory(prefix="locomo-") as tmp:
            root = Path(tmp)
            (root / "workspace" / "memory").mkdir(parents=True)
            layout = write_sessions(conversation, root / "sessions")
            facts = write_history(conversation, root / "workspace" / "memory") if history else {}
            index = BuiltinIndex(root / "workspace", root / "state" / "index.db", root / "sessions",
                                 window=window, stride=stride)
            started = time.monotonic()
            index.refresh()
            timings["index_seconds"] += time.monotonic() - started
            turns = all_turns(conversation)
            turn_bm25 = TurnBM25(turns)
            for question in conversation["questions"]:
                started = time.monotonic()
                ranked = builtin_ranking(index, layout, facts, question["question"])
                timings["search_seconds"] += time.monotonic() - started
                timings["questions"] += 1
                builtin.add(question["category"], question["evidence"], ranked)
                grep.add(question["category"], question["evidence"], grep_ranking(turns, question["question"]))
                bm25.add(question["category"], question["evidence"], turn_bm25.ranking(question["question"]))
            index.close()
    categories = sorted(builtin.rows)
    return {
        "overall_1_4": builtin.summary(HEADLINE),
        "per_category": {str(category): builtin.summary([category]) for category in categories},
        "baselines": {"grep_turns": grep.summary(HEADLINE), "bm25_turns": bm25.summary(HEADLINE)},
        "baselines_per_category": {"grep_turns": {str(c): grep.summary([c]) for c in categories},
                                   "bm25_turns": {str(c): bm25.summary([c]) for c in categories}},
        "settings": {"window": window, "stride": stride, "conversations": len(conversations), "top": TOP,
                     "history": "observations" if history else "none"},
        "timings": {key: round(value, 2) if isinstance(value, float) else value for key, value in timings.items()},
    }


def print_report(report: dict) -> None:
    """A readable table of the report."""
    def line(name: str, row: dict) -> str:
        return (f"{name:<22} R@5 {row['R@5']:5.1f}  R@10 {row['R@10']:5.1f}  MRR {row['MRR']:.3f}  "
                f"W@10 {row['W@10']:7.1f}  n={row['questions']}")

    settings = report["settings"]
    print(f"LoCoMo retrieval, {settings['conversations']} conversations, session windows of "
          f"{settings['window']} messages, stride {settings['stride']}, history: {settings['history']}")
    print(line("builtin cat 1-4", report["overall_1_4"]))
    for category, row in report["per_category"].items():
        print(line(f"builtin cat {category}", row))
    print(line("grep_turns cat 1-4", report["baselines"]["grep_turns"]))
    print(line("bm25_turns cat 1-4", report["baselines"]["bm25_turns"]))
    timings = report["timings"]
    per_query = 1000 * timings["search_seconds"] / max(1, timings["questions"])
    print(f"indexing {timings['index_seconds']:.2f}s, search {per_query:.2f} ms/question")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="locomo JSON (never copied into the repo)")
    parser.add_argument("--json", type=Path, help="write the report as JSON to this file")
    parser.add_argument("--limit-conversations", type=int, help="only the first N conversations")
    parser.add_argument("--window", type=int, default=WINDOW, help="messages per session window")
    parser.add_argument("--stride", type=int, default=STRIDE, help="messages between window starts")
    parser.add_argument("--history", choices=("none", "observations"), default="none",
                        help="also index history.jsonl entries made of LoCoMo's per-session observations")
    args = parser.parse_args(argv)
    report = run(args.data, args.limit_conversations, args.window, args.stride, args.history == "observations")
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
