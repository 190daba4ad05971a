"""How an LLM call fails: our error types, and the sorting of library errors (in the worker child, where litellm's
exceptions live) into the few kinds the retry policy (`llm.client`) decides on.

litellm reports a refused connection, a non-JSON body and a body without choices all as InternalServerError 500, so the
exception chain tells: an httpx status error means the server answered so; a timeout or transport error, no answer."""

from __future__ import annotations

import email.utils
import re
import time
from dataclasses import dataclass
from typing import Any

RETRYABLE_STATUSES = frozenset({408, 429})
MESSAGE_TEXT_LIMIT = 4000
ERROR_TEXT_LIMIT = 300  # an error's text in log lines, status and raised errors
BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)\S+")
# Failure kinds
TIMEOUT, CONNECTION, HTTP_STATUS, REJECTED, BAD_RESPONSE = "timeout", "connection", "http", "rejected", "bad_response"
WORKER = "worker"  # the LLM worker child died twice on one attempt (llm.process)


class LLMError(Exception):
    """Base of every error the adapter raises; *kind* and *status_code* let callers tell cases apart."""

    def __init__(self, message: str, *, kind: str = "error", status_code: int | None = None, attempts: int = 0):
        super().__init__(message)
        self.kind, self.status_code, self.attempts = kind, status_code, attempts


class LLMUnavailable(LLMError):
    """No usable answer can be had now: offline, timeouts, refused connections, 429/5xx, rejected requests."""


class LLMBadResponse(LLMError):
    """The server answered, but not with a completion we can use (garbage body, no choices, bad tool args)."""


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified for the retry decision: plain data, so it crosses the worker's pipe as is."""

    kind: str
    error_type: str  # the library error's class name, for log lines
    message: str
    status_code: int | None = None
    retry_after: float | None = None

    @classmethod
    def of(cls, kind: str, error: BaseException, status_code: int | None = None,
           retry_after: float | None = None) -> Failure:
        """The Failure of *error*, its text cut to MESSAGE_TEXT_LIMIT."""
        return cls(kind, type(error).__name__, str(error)[:MESSAGE_TEXT_LIMIT], status_code, retry_after)

    @property
    def retryable(self) -> bool:
        """A rejected request fails the same way every time; a call its worker child died under twice would
        kill the next one too."""
        return self.kind not in (REJECTED, WORKER)

    @property
    def label(self) -> str:
        """"timeout", "http 503", ... for log lines."""
        return f"{self.kind} {self.status_code}" if self.status_code else self.kind

    def describe(self, api_key: str | None) -> str:
        """The error's first line, short, with the API key and any bearer token blanked out."""
        lines = self.message.strip().splitlines()
        return redact(lines[0] if lines else self.error_type, api_key)[:ERROR_TEXT_LIMIT]

    def final_error(self, attempts: int, api_key: str | None) -> LLMError:
        """What the caller sees once retries are spent: LLMBadResponse or LLMUnavailable, its text redacted."""
        detail = self.describe(api_key)
        if self.kind == BAD_RESPONSE:
            return LLMBadResponse(f"bad LLM response: {detail}", kind=BAD_RESPONSE, attempts=attempts)
        status = f" (HTTP {self.status_code})" if self.status_code else ""
        return LLMUnavailable(f"LLM {self.kind}{status} after {attempts} attempt(s): {detail}", kind=self.kind,
                              status_code=self.status_code, attempts=attempts)


def classify_failure(error: BaseException) -> Failure:
    """Sort a library error into timeout / connection / HTTP status / rejected / bad response."""
    import httpx
    import openai

    links: list[BaseException] = []  # the error and everything it was raised from or while handling
    link: BaseException | None = error
    while link is not None and link not in links:
        links.append(link)
        link = link.__cause__ or link.__context__
    for link in links:
        if isinstance(link, httpx.HTTPStatusError):
            return http_failure(error, link.response.status_code, link.response.headers)
    for link in links:
        if type(link).__module__.startswith("openai") and isinstance(link, openai.APIStatusError):
            return http_failure(error, link.status_code, getattr(error, "litellm_response_headers", None))
    if any(isinstance(link, (TimeoutError, httpx.TimeoutException, openai.APITimeoutError)) for link in links):
        return Failure.of(TIMEOUT, error)
    if any(isinstance(link, (ConnectionError, httpx.TransportError, openai.APIConnectionError)) for link in links):
        return Failure.of(CONNECTION, error)
    status_code = getattr(error, "status_code", None)
    if status_code in RETRYABLE_STATUSES:
        return Failure.of(HTTP_STATUS, error, status_code)
    if isinstance(status_code, int) and 400 <= status_code < 500:
        # litellm refused the request itself (unknown provider, unsupported parameter, missing key).
        return Failure.of(REJECTED, error, status_code)
    return Failure.of(BAD_RESPONSE, error)


def http_failure(error: BaseException, status_code: int, headers: Any) -> Failure:
    """An HTTP error status: 408, 429 and 5xx are worth retrying, other 4xx are not."""
    if status_code in RETRYABLE_STATUSES or status_code >= 500:
        return Failure.of(HTTP_STATUS, error, status_code, retry_after_seconds(headers))
    return Failure.of(REJECTED, error, status_code)


def retry_after_seconds(headers: Any) -> float | None:
    """The server's Retry-After (seconds or HTTP date; OpenAI's retry-after-ms too), or None."""
    headers = headers or {}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            return max(float(headers.get(name)) / scale, 0.0)
        except (TypeError, ValueError):
            pass
    try:
        return max(email.utils.parsedate_to_datetime(headers.get("retry-after")).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


def redact(text: str, *secrets: str | None) -> str:
    """*text* with each secret and any bearer token blanked out, for log lines and error messages."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return BEARER_PATTERN.sub(lambda match: match.group(1) + "[redacted]", text)
