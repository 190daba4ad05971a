"""The LLM adapter: one async `complete` call over litellm, with our own timeout and retry policy.

Callers only ever see `LLMError` subclasses (and `asyncio.CancelledError`), so a job can fall back
(raw archive, no cursor advance) without knowing litellm. litellm costs seconds and ~190 MB to import
and keeps that memory, so it never enters this process: calls run in a worker process started on the
first online call and let go after `llm.idle_exit_seconds` without one (`llm.process`, `llm.worker`).
What a reply holds lives in `llm.reply`; how a call fails and when to retry, in `llm.failures`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.failures import (
    BAD_RESPONSE,
    Failure,
    LLMBadResponse,
    LLMUnavailable,
    error_name,
    final_error,
    may_retry,
    redact,
    retry_delay,
)
from nanobotd.llm.process import LLMWorker, WorkerFailure
from nanobotd.llm.reply import LLMReply, parse_reply

OFFLINE_MODELS = frozenset({"", "none"})
PLACEHOLDER_API_KEY = "sk-none"
ERROR_TEXT_LIMIT = 300
WORKER_CLOSE_SECONDS = 5.0


@dataclass(frozen=True)
class LLMSlots:
    """At most *count* LLM requests on their way at once, for every client given the same slots (the job
    queue's, daemon-wide); the worker child keeps an asyncio.Semaphore for each *key* (`llm.worker`)."""

    count: int
    key: str = field(default_factory=lambda: secrets.token_hex(8))


class LLMClient:
    """Sends chat completions through litellm in the worker; bounded concurrency, per-attempt timeout, our
    retries. *worker* is the daemon's, shared by its workspaces; without one the client starts its own."""

    def __init__(
        self,
        settings: LLMSettings,
        api_key: str | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        worker: LLMWorker | None = None,
    ):
        self.settings = settings
        self._api_key = api_key
        self._sleep = sleep
        self._slots = LLMSlots(max(1, settings.concurrency))
        # No process starts here: the first call starts the worker's child.
        self._own_worker = worker is None
        self.worker = worker or LLMWorker(idle_exit_seconds=settings.idle_exit_seconds)
        if self._own_worker:  # a client dropped without aclose() lets its worker's child go too
            weakref.finalize(self, self.worker.close)
        # The last call's outcome, for status: a model configured says nothing of whether calls get through.
        self.last_call: dict[str, Any] | None = None

    @property
    def offline(self) -> bool:
        """No model configured: every call fails at once and the daemon runs its fallbacks."""
        return self.settings.model.strip().lower() in OFFLINE_MODELS

    @property
    def mode(self) -> str:
        """"offline" or "online", for status."""
        return "offline" if self.offline else "online"

    async def complete(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        timeout: float | None = None,
    ) -> LLMReply:
        """One completion, retried on timeouts, connection errors, 429 and 5xx; see `retry_delay`."""
        if self.offline:
            raise LLMUnavailable("offline mode", kind="offline")
        attempt_timeout = float(timeout if timeout is not None else self.settings.timeout_seconds)
        request = self._request(messages, tools, max_tokens, temperature, attempt_timeout)
        bad_responses = 0
        attempt = 0
        while True:
            attempt += 1
            try:
                reply = await self._attempt(request, attempt_timeout, attempt)
            except LLMBadResponse as error:
                failure = Failure(BAD_RESPONSE, error)
            except WorkerFailure as error:  # CancelledError is a BaseException and passes through
                failure = error.failure
            else:
                self.last_call = {"ok": True, "at": time.time(), "error": None}
                return reply
            bad_responses += failure.kind == BAD_RESPONSE
            if not may_retry(failure, attempt, self.settings.max_retries, bad_responses):
                error = final_error(failure, attempt, self._describe(failure.error))
                self.last_call = {"ok": False, "at": time.time(), "error": str(error)[:ERROR_TEXT_LIMIT]}
                raise error from failure.error
            delay = retry_delay(attempt, failure.retry_after)
            logger.warning(
                "LLM call failed ({} {}: {}); attempt {} of {}, retrying in {:.1f}s",
                failure.label,
                error_name(failure.error),
                self._describe(failure.error),
                attempt,
                self.settings.max_retries + 1,
                delay,
            )
            await self._sleep(delay)

    async def _attempt(self, request: dict, attempt_timeout: float, attempt: int) -> LLMReply:
        """One attempt in the worker (sent once more to a new child if the first dies under it), holding a slot
        while its request is on its way."""
        answer = await self.worker.call(request, attempt_timeout, slots=(self._slots.key, self._slots.count))
        return parse_reply(answer["response"], latency_ms=float(answer.get("latency_ms") or 0.0), attempts=attempt)

    async def aclose(self) -> None:
        """Close the client's own worker; a worker given belongs to whoever made it."""
        if self._own_worker:
            await asyncio.to_thread(self.worker.close, WORKER_CLOSE_SECONDS)

    def _request(
        self, messages: list[dict], tools: list[dict] | None, max_tokens: int | None, temperature: float, timeout: float
    ) -> dict:
        request: dict[str, Any] = {
            "model": self.settings.model,
            "messages": list(messages),
            "timeout": timeout,
            "max_tokens": max_tokens if max_tokens is not None else self.settings.max_tokens,
            "temperature": temperature,
            # The OpenAI SDK under litellm retries 5xx twice by default; retries are ours alone.
            "max_retries": 0,
        }
        if tools:
            request["tools"] = tools
        if self.settings.api_base:
            request["api_base"] = self.settings.api_base
        api_key = self._api_key or (PLACEHOLDER_API_KEY if self.settings.api_base else None)
        if api_key:
            request["api_key"] = api_key
        return request

    def _describe(self, error: Exception) -> str:
        """The error's first line, short, with the API key and any bearer token blanked out."""
        lines = str(error).strip().splitlines()
        text = lines[0] if lines else error_name(error)
        return redact(text, self._api_key)[:ERROR_TEXT_LIMIT]

    def share_slots(self, slots: LLMSlots) -> None:
        """Take each request's slot from *slots*, shared with other clients (the daemon's job queue); until
        then the client has llm.concurrency slots of its own."""
        self._slots = slots
