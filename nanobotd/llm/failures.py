"""How an LLM call fails: our error types, the sorting of library errors, and the retry policy.

litellm wraps most failures in the same few exception types, so the truth is read from the exception
chain here, once, and the client only asks "retry, after how long, and what do we raise at the end".
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from dataclasses import dataclass
from typing import Any

BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 8.0
RETRY_AFTER_CAP_SECONDS = 30.0
BAD_RESPONSE_RETRIES = 1
RETRYABLE_STATUSES = frozenset({408, 429})
REDACTED = "[redacted]"
MESSAGE_TEXT_LIMIT = 4000
BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)\S+")

TIMEOUT = "timeout"
CONNECTION = "connection"
HTTP_STATUS = "http"
REJECTED = "rejected"
BAD_RESPONSE = "bad_response"
WORKER = "worker"  # the LLM worker process died twice on one attempt (see llm.process)


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
class Failure:
    """One failed attempt, classified for the retry decision."""

    kind: str
    error: Exception
    status_code: int | None = None
    retry_after: float | None = None

    @property
    def retryable(self) -> bool:
        """A rejected request fails the same way every time, and a worker that died twice on one call
        (after a restart) will die again; everything else may pass on a retry."""
        return self.kind not in (REJECTED, WORKER)

    @property
    def label(self) -> str:
        """"timeout", "http 503", ... for log lines."""
        return f"{self.kind} {self.status_code}" if self.status_code else self.kind


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


def may_retry(failure: Failure, attempt: int, max_retries: int, bad_responses: int) -> bool:
    """Whether attempt number *attempt* may be followed by another, given the failures so far."""
    if not failure.retryable or attempt > max_retries:
        return False
    # A garbled body may be a proxy hiccup worth one more try; a second one means the server is at fault.
    return failure.kind != BAD_RESPONSE or bad_responses <= BAD_RESPONSE_RETRIES


def retry_delay(attempt: int, retry_after: float | None = None) -> float:
    """Exponential backoff with jitter (about 0.5 s, 1 s, 2 s ... up to 8 s); a Retry-After wins if longer."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, RETRY_AFTER_CAP_SECONDS))
    return delay


def final_error(failure: Failure, attempts: int, detail: str) -> LLMError:
    """The error a caller sees once retries are spent: LLMBadResponse or LLMUnavailable, *detail* redacted."""
    if failure.kind == BAD_RESPONSE:
        return LLMBadResponse(f"bad LLM response: {detail}", kind=BAD_RESPONSE, attempts=attempts)
    status = f" (HTTP {failure.status_code})" if failure.status_code else ""
    message = f"LLM {failure.kind}{status} after {attempts} attempt(s): {detail}"
    return LLMUnavailable(message, kind=failure.kind, status_code=failure.status_code, attempts=attempts)


def redact(text: str, secret: str | None) -> str:
    """*text* with *secret* and bearer tokens replaced, for log lines and error messages."""
    if secret:
        text = text.replace(secret, REDACTED)
    return BEARER_PATTERN.sub(lambda match: match.group(1) + REDACTED, text)


class RemoteError(Exception):
    """An exception raised in the worker child, as the daemon sees it: its message and its class name."""

    def __init__(self, message: str, type_name: str):
        super().__init__(message)
        self.type_name = type_name


def error_name(error: BaseException) -> str:
    """The class name of *error*, or of the worker's exception a RemoteError stands for."""
    return getattr(error, "type_name", None) or type(error).__name__


def failure_to_json(failure: Failure) -> dict[str, Any]:
    """What the daemon needs of a failed attempt: its class for the retry policy and text for the logs."""
    return {"kind": failure.kind, "status_code": failure.status_code, "retry_after": failure.retry_after,
            "type": error_name(failure.error), "message": str(failure.error)[:MESSAGE_TEXT_LIMIT]}


def failure_from_json(data: dict) -> Failure:
    """The Failure a worker reported, its exception stood in for by a RemoteError."""
    error = RemoteError(str(data.get("message") or ""), str(data.get("type") or "Exception"))
    status_code, retry_after = data.get("status_code"), data.get("retry_after")
    return Failure(str(data.get("kind") or "error"), error, status_code if isinstance(status_code, int) else None,
                   float(retry_after) if isinstance(retry_after, (int, float)) else None)
