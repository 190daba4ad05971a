"""The LLM adapter: one async `complete` call over litellm, with our own timeout and retry policy.

Callers only ever see `LLMError` subclasses (and `asyncio.CancelledError`), so a job can fall back
(raw archive, no cursor advance) without knowing litellm. litellm costs seconds and ~165 MB to import,
so it is imported on the first online call, in a worker thread, never at module import.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from loguru import logger

from nanobotd.config.schema import LLMSettings

OFFLINE_MODELS = frozenset({"", "none"})
PLACEHOLDER_API_KEY = "sk-none"
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 8.0
RETRY_AFTER_CAP_SECONDS = 30.0
BAD_RESPONSE_RETRIES = 1
RETRYABLE_STATUSES = frozenset({408, 429})
ERROR_TEXT_LIMIT = 300
REDACTED = "[redacted]"
BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)\S+")

TIMEOUT = "timeout"
CONNECTION = "connection"
HTTP_STATUS = "http"
REJECTED = "rejected"
BAD_RESPONSE = "bad_response"


class LLMError(Exception):
    """Base of every error the adapter raises; *kind* and *status_code* let callers tell cases apart."""

    def __init__(self, message: str, *, kind: str = "error", status_code: int | None = None, attempts: int = 0):
        super().__init__(message)
        self.kind = kind
        self.status_code = status_code
        self.attempts = attempts


class LLMUnavailable(LLMError):
    """No usable answer can be had now: offline, timeouts, refused connections, 429/5xx, rejected requests."""


class LLMBadResponse(LLMError):
    """The server answered, but not with a completion we can use (garbage body, no choices, bad tool args)."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant reply, arguments already parsed into a JSON object."""

    id: str
    name: str
    arguments: dict
    raw_arguments: str


@dataclass(frozen=True)
class LLMReply:
    """What a completion gave us, plus the cost of getting it."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int

    def assistant_message(self) -> dict:
        """The OpenAI-format assistant message to append to the conversation before tool results."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.content}
        return {
            "role": "assistant",
            "content": self.content or None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.raw_arguments}}
                for call in self.tool_calls
            ],
        }


@dataclass
class UsageMeter:
    """Token, latency and error totals of one run, for its manifest and for status."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    retries: int = 0
    error_types: dict[str, int] = field(default_factory=dict)

    def add(self, reply: LLMReply) -> None:
        """Count a successful completion."""
        self.calls += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.latencies_ms.append(reply.latency_ms)
        self.retries += max(reply.attempts - 1, 0)

    def add_error(self, error: Exception) -> None:
        """Count a call that ended in an error."""
        self.errors += 1
        name = type(error).__name__
        self.error_types[name] = self.error_types.get(name, 0) + 1
        self.retries += max(getattr(error, "attempts", 0) - 1, 0)

    def to_json(self) -> dict:
        """A JSON-ready summary."""
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latencies_ms": [round(latency, 1) for latency in self.latencies_ms],
            "errors": self.errors,
            "retries": self.retries,
            "error_types": dict(self.error_types),
        }


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified for the retry decision."""

    kind: str
    error: Exception
    status_code: int | None = None
    retry_after: float | None = None

    @property
    def retryable(self) -> bool:
        return self.kind != REJECTED

    @property
    def label(self) -> str:
        """"timeout", "http 503", ... for log lines."""
        return f"{self.kind} {self.status_code}" if self.status_code else self.kind


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
            if not self._may_retry(failure, attempt, bad_responses):
                raise self._final_error(failure, attempt) from failure.error
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

    def _may_retry(self, failure: Failure, attempt: int, bad_responses: int) -> bool:
        if not failure.retryable or attempt > self.settings.max_retries:
            return False
        # A garbled body may be a proxy hiccup worth one more try; a second one means the server is at fault.
        return failure.kind != BAD_RESPONSE or bad_responses <= BAD_RESPONSE_RETRIES

    def _final_error(self, failure: Failure, attempts: int) -> LLMError:
        detail = self._describe(failure.error)
        if failure.kind == BAD_RESPONSE:
            return LLMBadResponse(f"bad LLM response: {detail}", kind=BAD_RESPONSE, attempts=attempts)
        status = f" (HTTP {failure.status_code})" if failure.status_code else ""
        message = f"LLM {failure.kind}{status} after {attempts} attempt(s): {detail}"
        return LLMUnavailable(message, kind=failure.kind, status_code=failure.status_code, attempts=attempts)

    def _describe(self, error: Exception) -> str:
        """The error's first line, short, with the API key and any bearer token blanked out."""
        lines = str(error).strip().splitlines()
        text = lines[0] if lines else type(error).__name__
        return redact(text, self._api_key)[:ERROR_TEXT_LIMIT]

    def _slot(self) -> asyncio.Semaphore:
        """The concurrency limiter of the running loop (tests run several loops in one process)."""
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


def classify_failure(error: BaseException) -> Failure:
    """Sort a library error into timeout / connection / HTTP status / rejected / bad response.

    litellm reports a refused connection, a non-JSON body and a body without choices all as
    InternalServerError 500, so the truth is read from the exception chain: an httpx status error means
    the server answered with that status; a timeout or transport error means it did not answer.
    """
    import httpx
    import openai

    links = exception_chain(error)
    for link in links:
        if isinstance(link, httpx.HTTPStatusError):
            return http_failure(error, link.response.status_code, link.response.headers)
    for link in links:
        if type(link).__module__.startswith("openai") and isinstance(link, openai.APIStatusError):
            return http_failure(error, link.status_code, getattr(error, "litellm_response_headers", None))
    if any(isinstance(link, (TimeoutError, httpx.TimeoutException, openai.APITimeoutError)) for link in links):
        return Failure(TIMEOUT, error)
    if any(isinstance(link, (ConnectionError, httpx.TransportError, openai.APIConnectionError)) for link in links):
        return Failure(CONNECTION, error)
    status_code = getattr(error, "status_code", None)
    if status_code in RETRYABLE_STATUSES:
        return Failure(HTTP_STATUS, error, status_code)
    if isinstance(status_code, int) and 400 <= status_code < 500:
        # litellm refused the request itself (unknown provider, unsupported parameter, missing key).
        return Failure(REJECTED, error, status_code)
    return Failure(BAD_RESPONSE, error)


def http_failure(error: BaseException, status_code: int, headers: Any) -> Failure:
    """An HTTP error status: 408, 429 and 5xx are worth retrying, other 4xx are not."""
    if status_code in RETRYABLE_STATUSES or status_code >= 500:
        return Failure(HTTP_STATUS, error, status_code, retry_after_seconds(headers))
    return Failure(REJECTED, error, status_code)


def exception_chain(error: BaseException) -> list[BaseException]:
    """*error* and everything it was raised from or while handling, outermost first."""
    links: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in links:
        links.append(current)
        current = current.__cause__ or current.__context__
    return links


def retry_after_seconds(headers: Any) -> float | None:
    """The server's Retry-After (seconds or HTTP date; OpenAI's retry-after-ms too), or None."""
    if not headers:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(float(milliseconds) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def retry_delay(attempt: int, retry_after: float | None = None) -> float:
    """Exponential backoff with jitter (about 0.5 s, 1 s, 2 s ... up to 8 s); a Retry-After wins if longer."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, RETRY_AFTER_CAP_SECONDS))
    return delay


def redact(text: str, secret: str | None) -> str:
    """*text* with *secret* and bearer tokens replaced, for log lines and error messages."""
    if secret:
        text = text.replace(secret, REDACTED)
    return BEARER_PATTERN.sub(lambda match: match.group(1) + REDACTED, text)


def response_dict(response: Any) -> dict:
    """litellm's ModelResponse as a plain dict."""
    if isinstance(response, dict):
        return response
    dump = getattr(response, "model_dump", None)
    if dump is None:
        raise LLMBadResponse(f"unexpected response type {type(response).__name__}", kind=BAD_RESPONSE)
    return dump()


def parse_reply(data: dict, *, latency_ms: float, attempts: int) -> LLMReply:
    """Turn an OpenAI-format completion into an LLMReply, or raise LLMBadResponse."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMBadResponse("response has no choices", kind=BAD_RESPONSE)
    choice = choices[0]
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise LLMBadResponse("response message is not an object", kind=BAD_RESPONSE)
    usage = data.get("usage") or {}
    return LLMReply(
        content=message_text(message.get("content")),
        tool_calls=tuple(parse_tool_call(call, index) for index, call in enumerate(message.get("tool_calls") or ())),
        finish_reason=str(choice.get("finish_reason") or ""),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        latency_ms=latency_ms,
        attempts=attempts,
    )


def message_text(content: Any) -> str:
    """Message content as text: None is "", a list of content parts is joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    raise LLMBadResponse(f"message content of type {type(content).__name__}", kind=BAD_RESPONSE)


def parse_tool_call(call: Any, index: int) -> ToolCall:
    """One tool call; arguments must be a JSON object (an empty string counts as {})."""
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not name:
        raise LLMBadResponse(f"tool call {index} has no function name", kind=BAD_RESPONSE)
    raw_arguments = function.get("arguments")
    if isinstance(raw_arguments, dict):
        raw_arguments = json.dumps(raw_arguments)
    raw_arguments = raw_arguments if isinstance(raw_arguments, str) else ""
    try:
        arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
    except ValueError as error:
        raise LLMBadResponse(f"tool call {name!r} arguments are not valid JSON: {error}", kind=BAD_RESPONSE) from error
    if not isinstance(arguments, dict):
        raise LLMBadResponse(f"tool call {name!r} arguments are not a JSON object", kind=BAD_RESPONSE)
    return ToolCall(id=call.get("id") or f"call_{index}", name=name, arguments=arguments, raw_arguments=raw_arguments)
