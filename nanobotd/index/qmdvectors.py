"""When QMD's vector modes (vsearch, query) may run: off by config, resting after a failure, or ready.

They need local models that may be missing, downloading or broken. One failure rests them for
VECTOR_RETRY_SECONDS, so searches do not each pay for it again; BM25 answers meanwhile and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loguru import logger

from nanobotd.index.qmdoutput import read_index_stats

VECTOR_RETRY_SECONDS = 1800.0


class VectorHealth:
    """Whether vector searches and `qmd embed` may run now, and the reason when they may not."""

    def __init__(self, enabled: bool, clock: Callable[[], float], index_path: Path, collection: str) -> None:
        self.enabled = enabled
        self._clock = clock
        self._index_path = index_path
        self._collection = collection
        self._failure: str | None = None
        self._retry_at = 0.0

    def blocked(self) -> bool:
        """True while a recent failure rests the vector modes."""
        return self._failure is not None and self._clock() < self._retry_at

    def unavailable_reason(self, mode: str) -> str | None:
        """Why *mode* must be answered with BM25 now, or None when it may run."""
        if not self.enabled:
            return f"{mode} needs vectors, which are off (search.qmd_vectors = false); answered with BM25"
        if self.blocked():
            return f"{self._failure}; answered with BM25"
        stats = read_index_stats(self._index_path, self._collection)
        if mode == "vsearch" and stats.documents and stats.needs_embedding == stats.documents:
            return "the index has no embeddings yet; answered with BM25"
        return None

    def record_failure(self, reason: str) -> str:
        """Rest the vector modes for a while; returns the reason to attach to the BM25 hits."""
        self._failure = reason
        self._retry_at = self._clock() + VECTOR_RETRY_SECONDS
        logger.warning("qmd vectors unusable for {:g}s: {}", VECTOR_RETRY_SECONDS, reason)
        return f"{reason}; answered with BM25"

    def status(self) -> str:
        """"off", "on" or "failing: <reason>", for freshness and status."""
        if not self.enabled:
            return "off"
        if self.blocked():
            return f"failing: {self._failure}"
        return "on"
