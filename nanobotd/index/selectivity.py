"""Keep a query affordable on a large index by leaving out its most common words.

FTS5's bm25() counts every unit matching each clause before it ranks anything, so a query costs
about a microsecond per posting of every word in it: "2026" on a year of history is 150,000
postings, 170 ms. A word found in that many units adds little to the ranking (its IDF is low), so
clauses are kept rarest first while their postings fit MATCH_BUDGET (the rarest always). On a small
index nothing is counted and nothing is dropped; clauses matching nothing are dropped for free.
Counting stops at the budget, so choosing costs at most a few milliseconds per word. When even the
rarest word is everywhere, only the newest MATCH_BUDGET units are ranked (by rowid, which grows as
units are indexed): a word that common ranks nothing well anyway, and the cost stays bounded. Counts are
cached until the index grows or shrinks by a tenth: they only steer which words are searched.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

MATCH_BUDGET = 10_000
CACHE_SIZE = 4096
DRIFT = 0.1


@dataclass(frozen=True)
class Selection:
    """The clauses to search and the lowest unit id worth ranking (0 = all)."""

    clauses: list[str]
    min_rowid: int = 0


class ClauseSelector:
    """Chooses the clauses of a query worth their cost, remembering how common each one is."""

    def __init__(self, budget: int = MATCH_BUDGET):
        self.budget = budget
        self._counts: dict[str, int] = {}
        self._units_seen = 0

    def select(self, connection: sqlite3.Connection, clauses: list[str], units: int) -> Selection:
        """The clauses to search, in their original order, and where the ranked units start."""
        if units * len(clauses) <= self.budget:
            return Selection(clauses)
        if abs(units - self._units_seen) > DRIFT * max(self._units_seen, 1):
            self._counts.clear()
            self._units_seen = units
        ranked = sorted((self._count(connection, clause), order, clause) for order, clause in enumerate(clauses))
        kept, spent = [], 0
        for count, order, clause in ranked:
            if count == 0:
                continue  # matches nothing: searching it changes no result
            if kept and spent + count > self.budget:
                break
            kept.append((order, clause))
            spent += count
        if not kept:
            return Selection(clauses[:1])
        if spent <= self.budget:
            return Selection([clause for _, clause in sorted(kept)])
        newest = connection.execute("SELECT max(id) FROM units").fetchone()[0] or 0
        return Selection([clause for _, clause in sorted(kept)], max(0, newest - self.budget))

    def _count(self, connection: sqlite3.Connection, clause: str) -> int:
        if clause not in self._counts:
            if len(self._counts) >= CACHE_SIZE:
                self._counts.clear()
            # Counting stops past the budget: beyond it, how common a clause is no longer matters.
            row = connection.execute(
                "SELECT count(*) FROM (SELECT rowid FROM units_fts WHERE units_fts MATCH ? LIMIT ?)",
                (clause, self.budget + 1),
            ).fetchone()
            self._counts[clause] = row[0]
        return self._counts[clause]
