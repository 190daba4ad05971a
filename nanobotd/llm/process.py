"""The daemon's side of the LLM worker child (`llm.worker`): where it starts, how it is talked to, how it ends.

litellm is big and never gives its memory back, so it lives only in the child: started by the first call, serving calls
concurrently, gone after `idle_exit_seconds` without one. A call whose child dies under it is sent once more, to a new
child; a child silent past a call's timeout is killed (a timeout). Its stderr reaches the daemon's log. One JSON object
a line, each way:

    child -> daemon  {"ready": PID}                                 litellm is imported, calls may come
    daemon -> child  {"op": "complete" | "embed", "id": N, "request": {...}, "timeout": S, "slots": [KEY, COUNT]}
    daemon -> child  {"op": "cancel", "id": N}                      the caller gave up; drop the call
    child -> daemon  {"id": N, "sending": true}                     its timeout runs (it holds its slot)
    child -> daemon  {"id": N, "response": {...}, "latency_ms": MS}  or  {"id": N, "failure": {...}}

Threads, not an event loop, read and write the pipes, so one worker serves callers on any loop (the daemon's, and the
executor threads that embed) and a stalled child never blocks one."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from loguru import logger

from nanobotd import tuning
from nanobotd.llm.failures import TIMEOUT, WORKER, Failure, redact

STDERR_LINE_LIMIT = 2000
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerFailure(Exception):
    """A call failed in or because of the worker; *failure* is what the retry policy decides on."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


def crashed(reason: str) -> WorkerFailure:
    """The child died (or never became ready) before answering: sent once more to a new one."""
    return WorkerFailure(Failure(WORKER, "RuntimeError", f"LLM worker {reason}"))


def worker_command(idle_exit_seconds: float) -> list[str]:
    """This interpreter running `llm.worker`, with this package importable whatever the working directory."""
    bootstrap = f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); from nanobotd.llm.worker import main; main()"
    return [sys.executable, "-c", bootstrap, f"{idle_exit_seconds:g}"]


class Mailbox(asyncio.Queue):
    """What the pipe threads deliver to one waiting caller, on the caller's own loop."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()

    def deliver(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody waits any more
            self.loop.call_soon_threadsafe(self.put_nowait, item)


class LLMWorker:
    """Starts, feeds and lets go of worker children, one at a time, shared by every call through it.
    *idle_exit_seconds* may change: the next child started keeps the new time."""

    def __init__(self, *, idle_exit_seconds: float = 300.0,
                 start_timeout: float = tuning.LLM_START_TIMEOUT_SECONDS, command: list[str] | None = None):
        self.idle_exit_seconds = max(float(idle_exit_seconds), 0.01)
        self.start_timeout = start_timeout
        self.command = command
        self.starts = 0
        self.secrets: set[str] = set()  # API keys calls carried, blanked out of the child's stderr
        self._lock = threading.Lock()
        self._child: WorkerChild | None = None
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        """The live child's process id, or None while there is none."""
        child = self._child
        return child.process.pid if child is not None else None

    async def call(self, request: dict, timeout: float, *, op: str = "complete",
                   slots: tuple[str, int] | None = None) -> dict:
        """Run litellm's `acompletion` (or `aembedding` for op "embed") with *request* in the child, holding
        one of *slots* while its HTTP request is on its way; {"response": ..., "latency_ms": ...}."""
        if request.get("api_key"):
            self.secrets.add(str(request["api_key"]))
        message = {"op": op, "request": request, "timeout": timeout, "slots": slots}
        for resend in (True, False):
            try:
                return await self._current().call({**message, "id": next(self._ids)}, timeout, self.start_timeout)
            except WorkerFailure as failure:
                if failure.failure.kind != WORKER or not resend:
                    raise
                logger.warning("{}; sending the call again to a new one", failure)

    async def start(self) -> None:
        """Start a child now and wait until it is ready, so the first call does not wait for litellm."""
        child = self._current()
        if not await asyncio.to_thread(child.ready.wait, self.start_timeout):
            child.kill(f"did not start within {self.start_timeout:g}s")

    def close(self, wait: float = 0.0) -> None:
        """Let the child go (it exits when its stdin closes); wait up to *wait* seconds, then kill it."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.retire()
            if wait > 0 and not child.exited.wait(wait):
                child.kill(f"did not exit within {wait:g}s of being closed")

    def _current(self) -> WorkerChild:
        with self._lock:
            if self._child is None or self._child.dead:
                try:
                    self._child = WorkerChild(self.command or worker_command(self.idle_exit_seconds), self)
                except OSError as error:
                    raise crashed(f"could not be started: {error}") from error
                self.starts += 1
            return self._child


class WorkerChild:
    """One child process and the three threads that write its stdin and read its stdout and stderr."""

    def __init__(self, command: list[str], owner: LLMWorker):
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, close_fds=True)
        self.owner = owner
        self.idle_exit_seconds = owner.idle_exit_seconds
        self.ready, self.exited = threading.Event(), threading.Event()
        self.dead: str | None = None
        self._lock = threading.Lock()
        self._waiting: dict[int, Mailbox] = {}  # by call id
        self._sending: set[int] = set()  # calls whose timeout runs
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._kill_reason: str | None = None
        self._retired = False
        for target, name in ((self._read, "out"), (self._write, "in"), (self._read_stderr, "err")):
            threading.Thread(target=target, name=f"llm-worker-{self.process.pid}-{name}", daemon=True).start()

    async def call(self, message: dict, timeout: float, start_timeout: float) -> dict:
        """Send one call and wait for its answer. Its timeout (plus a grace) runs from "sending": before that the child
        may be importing litellm (up to *start_timeout*) or the call queued behind others with their own deadlines."""
        call_id, box = message["id"], Mailbox()
        with self._lock:
            if self.dead:
                raise crashed(self.dead)
            self._waiting[call_id] = box
        self._outbox.put(json.dumps(message, default=str, ensure_ascii=False).encode() + b"\n")
        sending = False
        try:
            while True:
                starting = not self.ready.is_set()
                limit = start_timeout if starting else timeout
                try:
                    answer = await asyncio.wait_for(box.get(), limit + tuning.LLM_HANG_GRACE_SECONDS)
                except TimeoutError:
                    if not (sending or starting) and self._sending:
                        continue
                    reason = f"did not {'start' if starting else 'answer'} within {limit:g}s"
                    self.kill(reason)
                    raise (crashed(reason) if starting else
                           WorkerFailure(Failure(TIMEOUT, "TimeoutError", f"LLM worker {reason}; killed"))) from None
                if isinstance(answer, WorkerFailure):
                    raise answer
                if not answer.get("sending") and not answer.get("ready"):
                    break
                sending = sending or bool(answer.get("sending"))
        except asyncio.CancelledError:
            self._outbox.put(json.dumps({"op": "cancel", "id": call_id}).encode() + b"\n")
            raise
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)
                self._sending.discard(call_id)
        if "failure" in answer:
            raise WorkerFailure(Failure(**answer["failure"]))
        return answer

    def retire(self) -> None:
        """Close the child's stdin: it drops what it still runs, and exits."""
        self._retired = True
        self._outbox.put(None)

    def kill(self, reason: str) -> None:
        """SIGKILL the child (a stuck one cannot be asked); its other calls fail as a crash."""
        self._kill_reason = reason
        with contextlib.suppress(OSError):
            self.process.kill()

    def _write(self) -> None:
        stdin = self.process.stdin
        while (data := self._outbox.get()) is not None:
            try:
                stdin.write(data)
                stdin.flush()
            except (OSError, ValueError):
                return  # the child is gone; the reader reports it
        with contextlib.suppress(OSError):
            stdin.close()

    def _read(self) -> None:
        pid = self.process.pid
        for line in self.process.stdout:
            try:
                message = json.loads(line)
                call_id = message.get("id")
            except (ValueError, AttributeError):
                logger.warning("LLM worker {} wrote a line that is not protocol: {!r}", pid, line[:200])
                continue
            if "ready" in message:
                logger.info("LLM worker {} started (litellm ready in {:.1f}s)", pid, time.monotonic() - self.started)
                self.ready.set()
            with self._lock:
                if message.get("sending"):
                    self._sending.add(call_id)
                elif call_id is not None:
                    self._sending.discard(call_id)
                boxes = list(self._waiting.values()) if "ready" in message else [self._waiting.get(call_id)]
            for box in boxes:  # "ready" wakes every call, whose deadline now counts from its own timeout
                if box is not None:
                    box.deliver(message)
        self._exit()

    def _read_stderr(self) -> None:
        """What the child prints (a traceback, a library's log record) goes to the daemon's log, line by line."""
        for raw in self.process.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                line = redact(line, *self.owner.secrets)[:STDERR_LINE_LIMIT]
                logger.warning("LLM worker {}: {}", self.process.pid, line)

    def _exit(self) -> None:
        """stdout closed: reap the process, log why it went and fail whatever still waits on it."""
        try:
            code = self.process.wait(timeout=tuning.LLM_EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._outbox.put(None)
        reason = self._kill_reason or (f"exited with status {code}" if code >= 0 else f"was killed by signal {-code}")
        with self._lock:
            self.dead = reason
            boxes, self._waiting = list(self._waiting.values()), {}
        lived = time.monotonic() - self.started
        if boxes or code != 0 or self._kill_reason:
            logger.warning("LLM worker {} {} after {:.0f}s with {} call(s) waiting", self.process.pid, reason, lived,
                           len(boxes))
        else:
            why = "closed" if self._retired else f"idle for {self.idle_exit_seconds:g}s"
            logger.info("LLM worker {} exited ({}) after {:.0f}s", self.process.pid, why, lived)
        for box in boxes:
            box.deliver(crashed(reason))
        self.exited.set()
        with self.owner._lock:
            if self.owner._child is self:
                self.owner._child = None
