"""One builtin search: choose affordable clauses, fetch candidates from FTS5, rerank them in Python.
Apart from refresh and recovery (index.builtin), so ranking can be read, benchmarked and changed on its own."""

from __future__ import annotations

import json
import sqlite3

from nanobotd.index import ftsdb
from nanobotd.index.query import Query, quote
from nanobotd.index.rerank import QueryWeights, query_weights, rerank
from nanobotd.index.selectivity import ClauseSelector, Selection
from nanobotd.index.stems import Stemmer

LABEL_SEARCH_CHARS = 64


def ranked_units(connection: sqlite3.Connection, parsed: Query, selector: ClauseSelector, stemmer: Stemmer,
                 units: int, wanted: int) -> list[tuple[ftsdb.MatchRow, float]]:
    """Up to *wanted* candidate units for *parsed*, best first, each with its score in [0, 1]."""
    plan = _plan(connection, parsed, selector, stemmer, units)
    if plan is None:
        return []
    selection, weights = plan
    rows = ftsdb.match(connection, " OR ".join(selection.clauses), wanted,
                       newest_first=selection.newest_first or parsed.time_only)
    if parsed.time_only:
        # A time alone is a filter: every unit of that time matches fully, the newest first.
        return [(row, 1.0) for row in rows]
    return rerank(rows, weights, stemmer, part_spans)


def score_rows(connection: sqlite3.Connection, parsed: Query, selector: ClauseSelector, stemmer: Stemmer,
               units: int, rows: list[ftsdb.MatchRow]) -> list[tuple[ftsdb.MatchRow, float]]:
    """Scores in [0, 1] for texts found elsewhere (another backend), weighed with this index's word counts."""
    plan = _plan(connection, parsed, selector, stemmer, units)
    if plan is None or parsed.time_only:
        return [(row, 1.0 if parsed.time_only else 0.0) for row in rows]
    return rerank(rows, plan[1], stemmer, part_spans)


def _plan(connection: sqlite3.Connection, parsed: Query, selector: ClauseSelector, stemmer: Stemmer,
          units: int) -> tuple[Selection, QueryWeights] | None:
    """The clauses worth searching and the weight of every query word, or None when nothing can match."""
    stems = stemmer.stems(parsed.terms)
    # Words with the same stem ("painting", "paints") are searched once, as the first of them was typed
    # (FTS5 stems the query itself; a stem stemmed again is not always the same stem).
    clause_of: dict[str, str] = {}
    for term, stem in zip(parsed.terms, stems, strict=True):
        if stem:
            clause_of.setdefault(stem, quote(term))
    date_clauses = [f"dates : {quote(key)}" for key in parsed.date_keys]
    selection = selector.select(connection, list(clause_of.values()) + date_clauses, units)
    if not selection.clauses:
        return None
    counts = [selection.counts.get(clause_of[stem], 0) if stem else 0 for stem in stems]
    date_count = min(units, sum(selection.counts.get(clause, 0) for clause in date_clauses))
    return selection, query_weights(stems, counts, max(units, 1), parsed.date_keys, date_count)


def part_spans(row: ftsdb.MatchRow) -> list[tuple[int, int]]:
    """Character spans of a unit's parts: each message of a session window (without its speaker label),
    else each non-blank line."""
    if row.parts:
        try:
            offsets = [int(part[1]) for part in json.loads(row.parts)]
        except (ValueError, TypeError, IndexError):
            offsets = []
        if offsets:
            ends = [offset - 1 for offset in offsets[1:]] + [len(row.body)]
            spans = []
            for start, end in zip(offsets, ends, strict=True):
                label_end = row.body.find(": ", start, min(end, start + LABEL_SEARCH_CHARS))
                spans.append((label_end + 2 if label_end >= 0 else start, end))
            return spans
    spans, start = [], 0
    for line in row.body.split("\n"):
        if line.strip():
            spans.append((start, start + len(line)))
        start += len(line) + 1
    return spans
