"""Embeddings through the user's provider (litellm), for the optional vector half of search.

Synchronous on purpose: the index embeds on the daemon's executor threads, where blocking is wanted. The call runs in
the LLM worker child (`llm.process`); every failure is an `EmbeddingError`, so search falls back to BM25 alone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from typing import Any

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import OFFLINE_MODELS, api_fields
from nanobotd.llm.failures import BAD_RESPONSE, Failure
from nanobotd.llm.process import LLMWorker, WorkerFailure


class EmbeddingError(RuntimeError):
    """The embedding model could not answer (unreachable, refused, or an answer of the wrong shape)."""


class Embedder:
    """Turns texts into vectors with one litellm embedding model; one request per call, no retries."""

    def __init__(self, model: str, llm: LLMSettings, api_key: str | None = None, *, dimensions: int = 0,
                 timeout_seconds: float = 10.0, worker: LLMWorker | None = None):
        self.model = model.strip()
        self._request: dict[str, Any] = {"model": self.model, "timeout": timeout_seconds, **api_fields(llm, api_key)}
        if dimensions > 0:
            # litellm refuses the parameter for models it does not know to take it; then it is dropped.
            self._request.update(dimensions=dimensions, drop_params=True)
        self._api_key = api_key
        self._timeout = timeout_seconds
        self._worker = worker or LLMWorker(idle_exit_seconds=llm.idle_exit_seconds)
        if worker is None:  # an embedder dropped lets its own worker's child go
            weakref.finalize(self, self._worker.close)

    @property
    def enabled(self) -> bool:
        """False for `search.embeddings = "none"`."""
        return self.model.lower() not in OFFLINE_MODELS

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order; EmbeddingError when the model cannot give them."""
        if not self.enabled:
            raise EmbeddingError("embeddings are off (search.embeddings = \"none\")")
        if not texts:
            return []
        call = self._worker.call({**self._request, "input": texts}, self._timeout, op="embed")
        try:
            # a loop of its own, on a helper thread: the calling thread may run an event loop already
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embed") as helper:
                answer = helper.submit(asyncio.run, call).result()
            data = sorted(answer["response"]["data"], key=lambda item: item["index"])
            vectors = [[float(value) for value in item["embedding"]] for item in data]
        except WorkerFailure as exc:  # the worker names the library's error; the caller only needs "why"
            raise EmbeddingError(exc.failure.describe(self._api_key)) from exc
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EmbeddingError(f"{self.model} gave an answer of the wrong shape: "
                                 f"{Failure.of(BAD_RESPONSE, exc).describe(self._api_key)}") from exc
        if len(vectors) != len(texts) or any(not vector for vector in vectors):
            raise EmbeddingError(f"{self.model} gave {len(vectors)} vectors for {len(texts)} texts")
        return vectors
