"""The LLM adapter: one async `complete` call over litellm, with our own timeout and retry policy.

Callers only see `LLMError` subclasses (and CancelledError), so a job can fall back (raw archive, no cursor advance)
without knowing litellm, which never enters this process: calls run in the worker child (`llm.process`)."""

from __future__ import annotations

import asyncio
import random
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from nanobotd import tuning
from nanobotd.config.schema import LLMSettings
from nanobotd.llm.failures import BAD_RESPONSE, ERROR_TEXT_LIMIT, Failure, LLMBadResponse, LLMUnavailable
from nanobotd.llm.process import LLMWorker, WorkerFailure
from nanobotd.llm.reply import LLMReply, parse_reply

OFFLINE_MODELS = frozenset({"", "none"})
PLACEHOLDER_API_KEY = "sk-none"


@dataclass(frozen=True)
class LLMSlots:
    """At most *count* LLM requests on their way at once, for every client given the same slots (the job
    queue's, daemon-wide); the worker child keeps an asyncio.Semaphore for each *key* (`llm.worker`)."""

    count: int
    key: str = field(default_factory=lambda: secrets.token_hex(8))


def api_fields(settings: LLMSettings, api_key: str | None) -> dict[str, str]:
    """The endpoint and key a request carries; a server of the user's own (api_base) gets a placeholder key."""
    fields = {"api_base": settings.api_base} if settings.api_base else {}
    api_key = api_key or (PLACEHOLDER_API_KEY if settings.api_base else None)
    return {**fields, "api_key": api_key} if api_key else fields


def retry_delay(attempt: int, retry_after: float | None = None) -> float:
    """Exponential backoff with jitter, capped; a Retry-After wins if longer (capped too)."""
    ceiling = min(tuning.LLM_BACKOFF_CAP_SECONDS, tuning.LLM_BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    return max(delay, min(retry_after, tuning.LLM_RETRY_AFTER_CAP_SECONDS)) if retry_after is not None else delay


class LLMClient:
    """Sends chat completions through litellm in the worker; bounded concurrency, per-attempt timeout, our
    retries. *worker* is the daemon's, shared by its workspaces; without one the client starts its own."""

    def __init__(self, settings: LLMSettings, api_key: str | None = None, *,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep, worker: LLMWorker | None = None):
        self.settings = settings
        self._api_key = api_key
        self._sleep = sleep
        self._slots = LLMSlots(max(1, settings.concurrency))
        self._own_worker = worker is None  # no process starts here: the first call starts the child
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

    def share_slots(self, slots: LLMSlots) -> None:
        """Take each request's slot from *slots*, shared with other clients (the daemon's job queue); until
        then the client has llm.concurrency slots of its own."""
        self._slots = slots

    async def aclose(self) -> None:
        """Close the client's own worker; a worker given belongs to whoever made it."""
        if self._own_worker:
            await asyncio.to_thread(self.worker.close, tuning.LLM_CLOSE_WAIT_SECONDS)

    async def complete(self, messages: list[dict], *, tools: list[dict] | None = None, max_tokens: int | None = None,
                       temperature: float = 0.0, timeout: float | None = None) -> LLMReply:
        """One completion, retried on timeouts, connection errors, 429 and 5xx (and once on a bad body);
        never on a rejected request, nor on a call its worker child died under twice."""
        if self.offline:
            raise LLMUnavailable("offline mode", kind="offline")
        timeout = float(timeout if timeout is not None else self.settings.timeout_seconds)
        # The OpenAI SDK under litellm retries 5xx twice by default; retries are ours alone.
        request = {"model": self.settings.model, "messages": list(messages), "timeout": timeout, "max_retries": 0,
                   "max_tokens": max_tokens if max_tokens is not None else self.settings.max_tokens,
                   "temperature": temperature, **({"tools": tools} if tools else {}),
                   **api_fields(self.settings, self._api_key)}
        bad_responses = 0
        for attempt in range(1, self.settings.max_retries + 2):
            try:
                answer = await self.worker.call(request, timeout, slots=(self._slots.key, self._slots.count))
                reply = parse_reply(answer["response"], latency_ms=float(answer.get("latency_ms") or 0.0),
                                    attempts=attempt)
            except LLMBadResponse as error:
                failure = Failure.of(BAD_RESPONSE, error)
            except WorkerFailure as error:  # CancelledError is a BaseException and passes through
                failure = error.failure
            else:
                self.last_call = {"ok": True, "at": time.time(), "error": None}
                return reply
            bad_responses += failure.kind == BAD_RESPONSE
            if (attempt > self.settings.max_retries or not failure.retryable
                    or bad_responses > tuning.LLM_BAD_RESPONSE_RETRIES):
                break
            delay = retry_delay(attempt, failure.retry_after)
            logger.warning("LLM call failed ({} {}: {}); attempt {} of {}, retrying in {:.1f}s", failure.label,
                           failure.error_type, failure.describe(self._api_key), attempt,
                           self.settings.max_retries + 1, delay)
            await self._sleep(delay)
        error = failure.final_error(attempt, self._api_key)
        self.last_call = {"ok": False, "at": time.time(), "error": str(error)[:ERROR_TEXT_LIMIT]}
        raise error
