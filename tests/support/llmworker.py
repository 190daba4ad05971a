"""One LLM worker for the in-process clients of a test process: a client built without a worker starts a child
of its own, which imports litellm (seconds, many on a loaded machine); clients given this one share one child,
restarted by the worker itself whenever a test's call killed it."""

from __future__ import annotations

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import LLMClient
from nanobotd.llm.process import LLMWorker

_shared: list[LLMWorker] = []


def shared_worker() -> LLMWorker:
    """This process's worker, made on first use (its child starts with the first call through it)."""
    if not _shared:
        _shared.append(LLMWorker())
    return _shared[0]


def llm_client(settings: LLMSettings, api_key: str | None = None) -> LLMClient:
    """A real LLMClient for *settings* whose calls run in the shared worker's child."""
    return LLMClient(settings, api_key=api_key, worker=shared_worker())


def close_shared_worker() -> None:
    """Let the shared worker's child go (it would anyway when this process exits and its stdin closes)."""
    while _shared:
        _shared.pop().close(wait=5)
