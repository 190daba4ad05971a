"""Embeddings through the user's provider (litellm), for the optional vector half of search.

Synchronous on purpose: the index embeds its units and queries on the daemon's executor threads, where a
blocking call is what the caller wants. The call runs in the LLM worker process (`llm.process`), the
workspace's LLM client's when one is given, so litellm never enters the daemon. Every failure becomes an
`EmbeddingError`, so search falls back to BM25 alone without knowing litellm.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from collections.abc import Coroutine
from typing import Any

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import PLACEHOLDER_API_KEY
from nanobotd.llm.failures import error_name, redact
from nanobotd.llm.process import LLMWorker, WorkerFailure

OFF = frozenset({"", "none"})
ERROR_TEXT_LIMIT = 300


class EmbeddingError(RuntimeError):
    """The embedding model could not answer (unreachable, refused, or an answer of the wrong shape)."""


class Embedder:
    """Turns texts into vectors with one litellm embedding model; one request per call, no retries."""

    def __init__(self, model: str, llm: LLMSettings, api_key: str | None = None, *, dimensions: int = 0,
                 timeout_seconds: float = 10.0, worker: LLMWorker | None = None):
        self.model = model.strip()
        self._llm = llm
        self._api_key = api_key
        self._dimensions = dimensions
        self._timeout = timeout_seconds
        # The workspace's LLM worker; without one given, its own (no process until the first call).
        self._worker = worker or LLMWorker(idle_exit_seconds=llm.idle_exit_seconds)
        if worker is None:  # an embedder dropped lets its own worker's child go
            weakref.finalize(self, self._worker.close)

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
            answer = run_blocking(self._worker.call(request, self._timeout, op="embed"))
            data = sorted(_field(answer["response"], "data"), key=lambda item: _field(item, "index"))
            vectors = [[float(value) for value in _field(item, "embedding")] for item in data]
        except WorkerFailure as exc:  # the worker names the library's error; the caller only needs "why"
            raise EmbeddingError(self._describe(exc.failure.error)) from exc
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EmbeddingError(f"{self.model} gave an answer of the wrong shape: {self._describe(exc)}") from exc
        if len(vectors) != len(texts) or any(not vector for vector in vectors):
            raise EmbeddingError(f"{self.model} gave {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    def _describe(self, error: BaseException) -> str:
        text = str(error).strip()
        message = text.splitlines()[0] if text else error_name(error)
        return redact(message, self._api_key)[:ERROR_TEXT_LIMIT]


def run_blocking(call: Coroutine[Any, Any, dict]) -> dict:
    """Wait for *call* from synchronous code: on this thread's own loop, or on a helper thread when this
    thread already runs one (the worker answers any loop, so either way the answer arrives)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embed") as helper:
        return helper.submit(asyncio.run, call).result()


def _field(item: Any, name: str) -> Any:
    """A field of a litellm response object or of a plain dict."""
    return item[name] if isinstance(item, dict) else getattr(item, name)
