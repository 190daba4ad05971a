"""One LLM worker per process and idle time, shared by every client and embedder that holds it.

However many workspaces the daemon manages, their calls reach one worker (one litellm in memory, not one
per workspace); requests carry their own model, endpoint and key, so sharing mixes nothing. Workspaces
that ask for different `llm.idle_exit_seconds` get one worker per value. The last holder to let go closes
the worker; until then it still exits whenever it has been idle long enough, and comes back on demand.
"""

from __future__ import annotations

import threading
import weakref

from nanobotd.llm.process import LLMWorker

_lock = threading.Lock()
_workers: dict[float, LLMWorker] = {}
_holders: dict[int, int] = {}  # id(worker) -> holders


def hold_worker(idle_exit_seconds: float) -> LLMWorker:
    """The shared worker for *idle_exit_seconds*, made on first use (no process starts before a call)."""
    key = float(idle_exit_seconds)
    with _lock:
        worker = _workers.get(key)
        if worker is None:
            worker = _workers[key] = LLMWorker(idle_exit_seconds=key)
        _holders[id(worker)] = _holders.get(id(worker), 0) + 1
        return worker


def release_worker(worker: LLMWorker, wait: float = 0.0) -> None:
    """Let go of a worker from hold_worker; the last holder closes it (waiting up to *wait* seconds)."""
    with _lock:
        left = _holders.get(id(worker), 0) - 1
        if left > 0:
            _holders[id(worker)] = left
            return
        _holders.pop(id(worker), None)
        for key, held in list(_workers.items()):
            if held is worker:
                del _workers[key]
    worker.close(wait)


class WorkerHold:
    """*owner*'s hold on a shared worker, let go exactly once: by release(), or when *owner* is collected."""

    def __init__(self, owner: object, idle_exit_seconds: float):
        self.worker = hold_worker(idle_exit_seconds)
        self._finalizer = weakref.finalize(owner, release_worker, self.worker)

    def release(self, wait: float = 0.0) -> None:
        """Let go now (a second call does nothing)."""
        if self._finalizer.detach() is not None:
            release_worker(self.worker, wait)
