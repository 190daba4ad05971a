"""The JSON lines the daemon and its LLM worker process exchange over the worker's stdin and stdout.

One message per line, in either direction:

    worker -> daemon  {"ready": PID}                                 litellm is imported, calls may come
    daemon -> worker  {"op": "complete", "id": N, "request": {...}, "timeout": SECONDS, "gated": true, "slots": K}
    daemon -> worker  {"op": "go", "id": N}                          a gated call may send its request now
    daemon -> worker  {"op": "embed", "id": N, "request": {...}, "timeout": SECONDS}
    daemon -> worker  {"op": "cancel", "id": N}                      the caller gave up; drop the call
    worker -> daemon  {"id": N, "response": {...}, "latency_ms": MS} an OpenAI-format answer
    worker -> daemon  {"id": N, "failure": {...}}                    a failed call, classified by the worker
    worker -> daemon  {"id": N, "released": true, "handed_to": M}    a gated call's request is answered
    worker -> daemon  {"log": {"level": ..., "name": ..., "message": ...}}

A gated call is prepared at once (litellm builds its request) but sends nothing until its "go": the daemon
hands over a call while it still waits for an LLM slot, and sends "go" when it has one; the worker says
"released" the moment the request has its answer, before litellm has read it. So a slot is held only while
a request is on its way, not while litellm prepares one or reads one. If another gated call waits on the
same slots (K), the worker lets it send at once in the freed slot's place and names it ("handed_to"); its
"go" is then not needed. The call's timeout counts from its "go" (or hand-over) to its answer.

Failures are classified where the library's exceptions live (the worker), so the daemon never needs
litellm, openai or httpx to decide whether to retry.
"""

from __future__ import annotations

import json
from typing import Any

from nanobotd.llm.failures import Failure

OP_COMPLETE = "complete"  # litellm.acompletion(**request)
OP_EMBED = "embed"  # litellm.aembedding(**request)
OP_CANCEL = "cancel"
OP_GO = "go"  # a gated call may send its request
MESSAGE_TEXT_LIMIT = 4000


class RemoteError(Exception):
    """An exception raised in the worker, as the daemon sees it: its message and its class name."""

    def __init__(self, message: str, type_name: str):
        super().__init__(message)
        self.type_name = type_name


def encode(message: dict) -> bytes:
    """One protocol line; values JSON cannot hold (a library's odd types) are sent as text."""
    return json.dumps(message, default=str, ensure_ascii=False).encode("utf-8") + b"\n"


def decode(line: bytes) -> dict:
    """A protocol line as a dict; ValueError when it is not a JSON object."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a protocol line must hold a JSON object")
    return message


def failure_to_json(failure: Failure) -> dict[str, Any]:
    """What the daemon needs of a failed attempt: its class for the retry policy and text for the logs."""
    return {
        "kind": failure.kind,
        "status_code": failure.status_code,
        "retry_after": failure.retry_after,
        "type": error_name(failure.error),
        "message": str(failure.error)[:MESSAGE_TEXT_LIMIT],
    }


def failure_from_json(data: dict) -> Failure:
    """The Failure a worker reported, its exception stood in for by a RemoteError."""
    error = RemoteError(str(data.get("message") or ""), str(data.get("type") or "Exception"))
    status_code = data.get("status_code")
    retry_after = data.get("retry_after")
    return Failure(
        str(data.get("kind") or "error"),
        error,
        status_code if isinstance(status_code, int) else None,
        float(retry_after) if isinstance(retry_after, (int, float)) else None,
    )


def error_name(error: BaseException) -> str:
    """The class name of *error*, or of the worker's exception a RemoteError stands for."""
    return getattr(error, "type_name", None) or type(error).__name__
