"""Keep a query affordable on a large index: rank with the rarer words, fall back to the newest matches.

bm25() walks every posting of each phrase, then scores every matching unit, so a word common in a year of history
("2026") costs tens of ms. Clauses are kept rarest first while their matches fit MATCH_BUDGET (so common a word weighs
little, and the reranker still sees it); when even the rarest is everywhere, the newest units holding any word are
the candidates, with no bm25(). Counts stop at the budget; the costly ones (CACHED_FROM matches and more) are cached
until the index changes by a tenth. A rare word's count is taken again each time: cheap, and a word counted absent
must be found once a file holds it (the agent looks a fact up, writes it, looks again)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from nanobotd.tuning import MATCH_BUDGET

CACHE_SIZE = 4096
CACHED_FROM = 100
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
            count = connection.execute(
                "SELECT count(*) FROM (SELECT rowid FROM units_fts WHERE units_fts MATCH ? LIMIT ?)",
                (clause, self.budget + 1),
            ).fetchone()[0]
            if count < CACHED_FROM:
                return count
            self._counts[clause] = count
        return self._counts[clause]
