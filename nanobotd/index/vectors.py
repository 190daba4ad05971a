"""The optional vector half of builtin search: unit embeddings kept as int8, fused with BM25 by rank.

Normalised vectors are stored as one signed byte per dimension in the index database beside their units (a unit
that goes takes its vector); the int8 dot product is exact enough for ranking. The standard library does the
arithmetic (no dependency for an option off by default); the cost grows with the index, so the codes are cached in
memory as bytes until it changes. Embedding runs after a refresh in bounded batches; a failing model rests
RETRY_SECONDS, and search meanwhile answers with BM25 alone (status says why)."""

from __future__ import annotations

import math
import sqlite3
import time
from array import array
from collections.abc import Callable

from loguru import logger

from nanobotd.index import ftsdb
from nanobotd.index.ftsdb import MatchRow

EMBED_BATCH = 64
MAX_EMBED_PER_REFRESH = 2048
MAX_TEXT_CHARS = 4000
RETRY_SECONDS = 600.0
RRF_K = 60
VECTOR_CANDIDATES = 50

Embed = Callable[[list[str]], list[list[float]]]


def quantize(vector: list[float]) -> bytes:
    """A vector normalised to unit length, as one signed byte per dimension."""
    norm = math.sqrt(sum(value * value for value in vector)) or 1.0
    return array("b", [max(-127, min(127, round(127 * value / norm))) for value in vector]).tobytes()


def similarity(first: array, second: array) -> float:
    """Cosine similarity of two int8 codes of normalised vectors (-1..1)."""
    return sum(a * b for a, b in zip(first, second, strict=False)) / (127 * 127)


def with_vectors(connection: sqlite3.Connection, ranked: list[tuple[MatchRow, float]],
                 nearest: list[tuple[int, float]]) -> list[tuple[MatchRow, float]]:
    """BM25 candidates and nearest units in reciprocal-rank-fusion order; a unit shows the better of its
    lexical score and its cosine similarity."""
    if not nearest:
        return ranked
    rows = {row.unit_id: (row, score) for row, score in ranked}
    near = dict(nearest)
    extra = ftsdb.fetch(connection, [unit_id for unit_id, _ in nearest if unit_id not in rows])
    rows.update((row.unit_id, (row, 0.0)) for row in extra)
    order = fuse([row.unit_id for row, _ in ranked], [unit_id for unit_id, _ in nearest])
    return [(rows[unit_id][0], max(rows[unit_id][1], near.get(unit_id, 0.0))) for unit_id in order if unit_id in rows]


def fuse(*rankings: list, offset: int = RRF_K + 1) -> list:
    """Keys ordered by reciprocal rank fusion of *rankings* (each best first): 1 / (offset + rank) summed."""
    scores: dict = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            scores[key] = scores.get(key, 0.0) + 1.0 / (offset + rank)
    return sorted(scores, key=lambda key: -scores[key])


class VectorIndex:
    """Embeds units without a vector and finds the units nearest a query."""

    def __init__(self, embed: Embed, clock: Callable[[], float] = time.monotonic):
        self._embed = embed
        self._clock = clock
        self._codes: list[tuple[int, array]] | None = None
        self._resting_until = 0.0
        self.last_error: str | None = None

    def changed(self) -> None:
        """Units came or went (their vectors go with them, in ftsdb): read the codes again when next needed."""
        self._codes = None

    def pending(self, connection: sqlite3.Connection, limit: int = EMBED_BATCH) -> list[tuple[int, str]]:
        """(unit id, text) of units with text and no vector yet; none while the model rests after a failure."""
        if self._clock() < self._resting_until:
            return []
        return connection.execute(
            "SELECT f.rowid, f.body FROM units_fts f LEFT JOIN vectors v ON v.unit_id = f.rowid "
            "WHERE v.unit_id IS NULL LIMIT ?", (limit,)).fetchall()

    def codes_for(self, batch: list[tuple[int, str]]) -> list[bytes] | None:
        """The int8 codes of a batch of texts (called without the index lock: it waits on the network);
        None when the model failed, which rests it."""
        try:
            vectors = self._embed([text[:MAX_TEXT_CHARS] for _, text in batch])
        except Exception as exc:  # the model is optional: note why, rest, and let BM25 answer
            self._rest(f"embedding units failed: {exc}")
            return None
        self.last_error = None
        return [quantize(vector) for vector in vectors]

    def store(self, connection: sqlite3.Connection, batch: list[tuple[int, str]], codes: list[bytes]) -> None:
        """Keep the codes of units that still exist (one may have gone while the model was asked)."""
        connection.executemany(
            "INSERT OR REPLACE INTO vectors (unit_id, code) "
            "SELECT ?, ? WHERE EXISTS (SELECT 1 FROM units WHERE id = ?)",
            [(unit_id, code, unit_id) for (unit_id, _), code in zip(batch, codes, strict=True)])
        self._codes = None

    def nearest(self, connection: sqlite3.Connection, query: str,
                limit: int = VECTOR_CANDIDATES) -> list[tuple[int, float]]:
        """(unit id, cosine similarity) of the units nearest the query, best first; none when the model
        cannot embed it now."""
        if self._clock() < self._resting_until:
            return []
        try:
            code = array("b", quantize(self._embed([query[:MAX_TEXT_CHARS]])[0]))
        except Exception as exc:
            self._rest(f"embedding the query failed: {exc}")
            return []
        if self._codes is None:
            self._codes = [(unit_id, array("b", blob)) for unit_id, blob in connection.execute(
                "SELECT unit_id, code FROM vectors")]
        scored = sorted(((similarity(code, other), unit_id) for unit_id, other in self._codes), reverse=True)
        return [(unit_id, score) for score, unit_id in scored[:limit]]

    def status(self) -> dict:
        """Whether vectors are usable now, and the last failure."""
        return {"resting": self._clock() < self._resting_until, "last_error": self.last_error}

    def _rest(self, reason: str) -> None:
        self.last_error = reason
        self._resting_until = self._clock() + RETRY_SECONDS
        logger.warning("search embeddings unusable for {:g}s: {}", RETRY_SECONDS, reason)
