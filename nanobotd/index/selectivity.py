"""Keep a query affordable on a large index: rank with the rarer words, fall back to the newest matches.

FTS5's bm25() first walks the whole posting list of every phrase in the expression (to count the units
holding it), then scores every matching unit: about 80 ns per posting plus 2 µs per matching unit. "2026"
on a year of history is 150,000 postings: 30 ms. So clauses are kept rarest first while the units they
match fit MATCH_BUDGET (1,000: about 3 ms); a word found in that many units adds little to the
ranking anyway (its IDF is low), and the reranker still weighs it in every candidate's text. When even
the rarest word is everywhere, no bm25() runs at all: the newest units holding any of the words are
the candidates (FTS5 reads them newest first and stops at the limit), and the reranker orders them.

How common a clause is gets counted up to the budget (counting stops there) and cached until the index
grows or shrinks by a tenth: the counts steer which words are searched and weigh them in the reranker.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from nanobotd.tuning import MATCH_BUDGET

CACHE_SIZE = 4096
DRIFT = 0.1


@dataclass(frozen=True)
class Selection:
    """The clauses to search, whether to take the newest matches instead of ranking, and each clause's count."""

    clauses: list[str]
    newest_first: bool = False
    counts: dict[str, int] = field(default_factory=dict)


class ClauseSelector:
    """Chooses the clauses of a query worth their cost, remembering how common each one is."""

    def __init__(self, budget: int = MATCH_BUDGET):
        self.budget = budget
        self._counts: dict[str, int] = {}
        self._units_seen = 0

    def select(self, connection: sqlite3.Connection, clauses: list[str], units: int) -> Selection:
        """The clauses to search, in their original order, with how many units hold each (capped)."""
        if abs(units - self._units_seen) > DRIFT * max(self._units_seen, 1):
            self._counts.clear()
            self._units_seen = units
        counts = {clause: self.count(connection, clause) for clause in clauses}
        ranked = sorted((count, order, clause) for order, (clause, count) in enumerate(counts.items()) if count)
        if not ranked:
            return Selection([], counts=counts)
        kept, spent = [], 0
        for count, order, clause in ranked:
            if spent + count > self.budget:
                break
            kept.append((order, clause))
            spent += count
        if not kept:
            # Every word is everywhere: bm25 over any of them would cost its whole posting list.
            return Selection([clause for _, _, clause in ranked], newest_first=True, counts=counts)
        return Selection([clause for _, clause in sorted(kept)], counts=counts)

    def count(self, connection: sqlite3.Connection, clause: str) -> int:
        """Units matching *clause*, counted up to just past the budget (more makes no difference)."""
        if clause not in self._counts:
            if len(self._counts) >= CACHE_SIZE:
                self._counts.clear()
            row = connection.execute(
                "SELECT count(*) FROM (SELECT rowid FROM units_fts WHERE units_fts MATCH ? LIMIT ?)",
                (clause, self.budget + 1),
            ).fetchone()
            self._counts[clause] = row[0]
        return self._counts[clause]
