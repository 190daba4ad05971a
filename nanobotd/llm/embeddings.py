"""Embeddings through the user's provider (litellm), for the optional vector half of search.

Synchronous on purpose: the index embeds its units and queries on the daemon's executor threads, where a
blocking call is what the caller wants. litellm is imported on the first call. Every failure becomes an
`EmbeddingError`, so search falls back to BM25 alone without knowing litellm.
"""

from __future__ import annotations

import threading
from typing import Any

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import PLACEHOLDER_API_KEY, import_litellm
from nanobotd.llm.failures import redact

OFF = frozenset({"", "none"})
ERROR_TEXT_LIMIT = 300


class EmbeddingError(RuntimeError):
    """The embedding model could not answer (unreachable, refused, or an answer of the wrong shape)."""


class Embedder:
    """Turns texts into vectors with one litellm embedding model; one request per call, no retries."""

    def __init__(self, model: str, llm: LLMSettings, api_key: str | None = None, *, dimensions: int = 0,
                 timeout_seconds: float = 10.0):
        self.model = model.strip()
        self._llm = llm
        self._api_key = api_key
        self._dimensions = dimensions
        self._timeout = timeout_seconds
        self._litellm: Any = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """False for `search.embeddings = "none"`."""
        return self.model.lower() not in OFF

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order; EmbeddingError when the model cannot give them."""
        if not self.enabled:
            raise EmbeddingError("embeddings are off (search.embeddings = \"none\")")
        if not texts:
            return []
        request: dict[str, Any] = {"model": self.model, "input": texts, "timeout": self._timeout}
        if self._llm.api_base:
            request["api_base"] = self._llm.api_base
        api_key = self._api_key or (PLACEHOLDER_API_KEY if self._llm.api_base else None)
        if api_key:
            request["api_key"] = api_key
        if self._dimensions > 0:
            # litellm refuses the parameter for models it does not know to take it; then it is dropped.
            request.update(dimensions=self._dimensions, drop_params=True)
        try:
            response = self._load().embedding(**request)
            data = sorted(_field(response, "data"), key=lambda item: _field(item, "index"))
            vectors = [[float(value) for value in _field(item, "embedding")] for item in data]
        except Exception as exc:  # litellm raises many types; the caller only needs "no vectors, why"
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EmbeddingError(redact(message, self._api_key)[:ERROR_TEXT_LIMIT]) from exc
        if len(vectors) != len(texts) or any(not vector for vector in vectors):
            raise EmbeddingError(f"{self.model} gave {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    def _load(self) -> Any:
        with self._lock:
            if self._litellm is None:
                self._litellm = import_litellm()
            return self._litellm


def _field(item: Any, name: str) -> Any:
    """A field of a litellm response object or of a plain dict."""
    return item[name] if isinstance(item, dict) else getattr(item, name)
