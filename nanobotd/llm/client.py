"""The LLM adapter: one async `complete` call over litellm, with our own timeout and retry policy.

Callers only ever see `LLMError` subclasses (and `asyncio.CancelledError`), so a job can fall back
(raw archive, no cursor advance) without knowing litellm. litellm costs seconds and ~165 MB to import,
so it is imported on the first online call, in a worker thread, never at module import.
What a reply holds lives in `llm.reply`; how a call fails and when to retry, in `llm.failures`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.failures import (
    BAD_RESPONSE,
    Failure,
    LLMBadResponse,
    LLMUnavailable,
    classify_failure,
    final_error,
    may_retry,
    redact,
    retry_delay,
)
from nanobotd.llm.reply import LLMReply, parse_reply, response_dict

OFFLINE_MODELS = frozenset({"", "none"})
PLACEHOLDER_API_KEY = "sk-none"
ERROR_TEXT_LIMIT = 300


class LLMClient:
    """Sends chat completions through litellm; bounded concurrency, per-attempt timeout, our retries."""

    def __init__(
        self,
        settings: LLMSettings,
        api_key: str | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        self.settings = settings
        self._api_key = api_key
        self._sleep = sleep
        self._litellm: Any = None
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._shared_slots: asyncio.Semaphore | None = None

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
        litellm = await self._load_litellm()
        attempt_timeout = float(timeout if timeout is not None else self.settings.timeout_seconds)
        request = self._request(messages, tools, max_tokens, temperature, attempt_timeout)
        bad_responses = 0
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._attempt(litellm, request, attempt_timeout, attempt)
            except LLMBadResponse as error:
                failure = Failure(BAD_RESPONSE, error)
            except Exception as error:  # CancelledError is a BaseException and passes through
                failure = classify_failure(error)
            bad_responses += failure.kind == BAD_RESPONSE
            if not may_retry(failure, attempt, self.settings.max_retries, bad_responses):
                raise final_error(failure, attempt, self._describe(failure.error)) from failure.error
            delay = retry_delay(attempt, failure.retry_after)
            logger.warning(
                "LLM call failed ({} {}: {}); attempt {} of {}, retrying in {:.1f}s",
                failure.label,
                type(failure.error).__name__,
                self._describe(failure.error),
                attempt,
                self.settings.max_retries + 1,
                delay,
            )
            await self._sleep(delay)

    async def _attempt(self, litellm: Any, request: dict, attempt_timeout: float, attempt: int) -> LLMReply:
        async with self._slot():
            started = time.perf_counter()
            # litellm's own timeout is not always honoured by a server that accepts and then stalls.
            response = await asyncio.wait_for(litellm.acompletion(**request), attempt_timeout)
            latency_ms = (time.perf_counter() - started) * 1000
        return parse_reply(response_dict(response), latency_ms=latency_ms, attempts=attempt)

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
        text = lines[0] if lines else type(error).__name__
        return redact(text, self._api_key)[:ERROR_TEXT_LIMIT]

    def share_slots(self, slots: asyncio.Semaphore) -> None:
        """Take each request's slot from *slots*, a limiter shared with other clients (the daemon's job queue)."""
        self._shared_slots = slots

    def _slot(self) -> asyncio.Semaphore:
        """The concurrency limiter of the running loop (tests run several loops in one process)."""
        if self._shared_slots is not None:
            return self._shared_slots
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(max(1, self.settings.concurrency)))
        return self._slots[1]

    async def _load_litellm(self) -> Any:
        if self._litellm is None:
            self._litellm = await asyncio.to_thread(import_litellm)
        return self._litellm


def import_litellm() -> Any:
    """Import and quiet litellm: no network at import, no telemetry, no "Give Feedback" banners."""
    # Without this litellm fetches its model cost map from GitHub while importing.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    # litellm attaches its own stderr handler at import; route it through ours (and its secret masking).
    from nanobotd.logsetup import capture_library_loggers

    capture_library_loggers()
    return litellm
