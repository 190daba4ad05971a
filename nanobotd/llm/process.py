"""The daemon's handle on its LLM worker process (`llm.worker`): started on demand, let go when idle.

Keeping litellm out of the daemon keeps its ~190 MB out of a process that lives for months: the worker
starts with the first call, serves calls concurrently, and is told to exit (its stdin closed) after
`idle_exit_seconds` without one. A call whose worker dies under it is sent once more, to a new worker; a
worker that does not answer within a call's timeout is killed and the call fails as a timeout. What the
worker writes to stderr, and its library log records, reach the daemon's log.

Threads, not the event loop, talk to the pipes, so one handle serves callers on any event loop (the
daemon has one; tests run many) and a stalled worker can never block a loop.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import subprocess
import threading
import time
from dataclasses import dataclass

from loguru import logger

from nanobotd.llm.failures import TIMEOUT, WORKER, Failure, redact
from nanobotd.llm.protocol import OP_CANCEL, OP_COMPLETE, OP_GO, decode, encode, failure_from_json
from nanobotd.llm.slots import LLMSlots, SlotTicket
from nanobotd.tokenprocess import worker_command as child_command

IDLE_EXIT_SECONDS = 300.0
START_TIMEOUT_SECONDS = 60.0  # importing litellm takes ~2.5 s on an idle machine; far longer under load
# The worker enforces a call's timeout itself and reports it; the daemon allows this much more before it
# decides the worker itself is stuck and kills it.
HANG_GRACE_SECONDS = 1.0
EXIT_WAIT_SECONDS = 5.0
STDERR_LINE_LIMIT = 2000


class WorkerFailure(Exception):
    """A call failed in or because of the worker; *failure* is what the retry policy decides on."""

    def __init__(self, failure: Failure):
        super().__init__(str(failure.error))
        self.failure = failure


class WorkerCrashed(WorkerFailure):
    """The worker process died (or never became ready) before answering."""

    def __init__(self, reason: str):
        super().__init__(Failure(WORKER, RuntimeError(f"LLM worker {reason}")))
        self.reason = reason


@dataclass(frozen=True)
class WorkerAnswer:
    """A completion as the worker sent it: the OpenAI-format dict, and how long litellm took."""

    response: dict
    latency_ms: float


def worker_command() -> list[str]:
    """This interpreter running `llm.worker`, with this package importable whatever the working directory."""
    return child_command("nanobotd.llm.worker", "main")


class LLMWorker:
    """Starts, feeds and retires worker processes; one at a time, shared by every call through it."""

    def __init__(self, *, idle_exit_seconds: float = IDLE_EXIT_SECONDS,
                 start_timeout: float = START_TIMEOUT_SECONDS, command: list[str] | None = None):
        self.idle_exit_seconds = max(float(idle_exit_seconds), 0.01)
        self.start_timeout = start_timeout
        self.command = command or worker_command()
        self.starts = 0
        self.secrets: set[str] = set()  # API keys calls carried, blanked out of the worker's stderr
        self._lock = threading.Lock()
        self._child: WorkerChild | None = None
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        """The live worker's process id, or None while there is none."""
        child = self._child
        return child.process.pid if child is not None else None

    async def call(self, request: dict, timeout: float, *, op: str = OP_COMPLETE,
                   slots: LLMSlots | None = None) -> WorkerAnswer:
        """Run one litellm call (`acompletion`, or `aembedding` for OP_EMBED) with *request* in the worker,
        starting one if needed; a worker that dies under the call is replaced and the call sent once more.

        With *slots*, the worker prepares the call at once and sends its request only once it holds one of
        them, until the request is answered: litellm's own work on a call overlaps another's request.
        """
        if request.get("api_key"):
            self.secrets.add(str(request["api_key"]))
        try:
            return await self._call_once(op, request, timeout, slots)
        except WorkerCrashed as crash:
            logger.warning("LLM worker {}; sending the call again to a new one", crash.reason)
            return await self._call_once(op, request, timeout, slots)

    async def _call_once(self, op: str, request: dict, timeout: float, slots: LLMSlots | None) -> WorkerAnswer:
        child = self._acquire()
        try:
            await child.wait_ready(self.start_timeout)
            return await child.call(op, next(self._ids), request, timeout, slots)
        finally:
            self._release(child)

    async def start(self) -> None:
        """Start a worker now and wait until it is ready, so the first call does not wait for litellm."""
        child = self._acquire()
        try:
            await child.wait_ready(self.start_timeout)
        finally:
            self._release(child)

    def close(self, wait: float = 0.0) -> None:
        """Let the worker go (it exits when its stdin closes); wait up to *wait* seconds, then kill it."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.retire("closed")
            if wait > 0 and not child.exited.wait(wait):
                child.kill(f"did not exit within {wait:g}s of being closed")

    def _acquire(self) -> WorkerChild:
        with self._lock:
            if self._child is None or self._child.dead:
                try:
                    self._child = WorkerChild(self.command, on_exit=self._forget, secrets=self.secrets)
                except OSError as error:
                    raise WorkerCrashed(f"could not be started: {error}") from error
                self.starts += 1
                threading.Thread(target=self._watch_idle, args=(self._child,), name="llm-worker-idle",
                                 daemon=True).start()
            self._child.active += 1
            return self._child

    def _release(self, child: WorkerChild) -> None:
        with self._lock:
            child.active -= 1
            child.last_used = time.monotonic()

    def _forget(self, child: WorkerChild) -> None:
        with self._lock:
            if self._child is child:
                self._child = None

    def _watch_idle(self, child: WorkerChild) -> None:
        """Retire *child* once it has had no call for idle_exit_seconds."""
        while True:
            with self._lock:
                if self._child is not child:
                    return
                idle_for = time.monotonic() - child.last_used
                if child.active == 0 and idle_for >= self.idle_exit_seconds:
                    self._child = None
                    break
                remaining = self.idle_exit_seconds - idle_for if child.active == 0 else self.idle_exit_seconds
            if child.exited.wait(max(remaining, 0.01)):
                return
        child.retire(f"idle for {self.idle_exit_seconds:g}s")


class WorkerChild:
    """One worker process and the threads that write its stdin and read its stdout and stderr."""

    def __init__(self, command: list[str], *, on_exit, secrets: set[str]):
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, close_fds=True)
        self.active = 0
        self.last_used = time.monotonic()
        self.ready = False
        self.dead: str | None = None
        self.exited = threading.Event()
        self._on_exit = on_exit
        self._secrets = secrets
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._tickets: dict[int, SlotTicket] = {}  # the slots of gated calls, by call id
        self._ready_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._kill_reason: str | None = None
        self._retire_reason: str | None = None
        pid = self.process.pid
        for target, name in ((self._read, "out"), (self._write, "in"), (self._read_stderr, "err")):
            threading.Thread(target=target, name=f"llm-worker-{pid}-{name}", daemon=True).start()

    async def wait_ready(self, timeout: float) -> None:
        """Until the worker has imported litellm; WorkerCrashed if it dies or takes longer than *timeout*."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.dead:
                raise WorkerCrashed(self.dead)
            if self.ready:
                return
            future = loop.create_future()
            self._ready_waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self.kill(f"did not start within {timeout:g}s")
            raise WorkerCrashed(f"did not start within {timeout:g}s") from None

    async def call(self, op: str, call_id: int, request: dict, timeout: float,
                   slots: LLMSlots | None = None) -> WorkerAnswer:
        """Send one call and wait for its answer; a worker silent past timeout + grace is killed.

        With *slots*, the call is sent gated: the worker prepares it while it waits for a slot, and sends its
        request on the "go" the slot's grant sends. The slot is given back as soon as the worker says the
        request is answered (or with the answer), from the pipe's reader thread, which hands it straight to
        the next waiting call. The timeout counts from the grant."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        ticket: SlotTicket | None = None
        gating = {"gated": True, "slots": id(slots)} if slots is not None else {}
        data = encode({"op": op, "id": call_id, "request": request, "timeout": timeout, **gating})
        go = encode({"op": OP_GO, "id": call_id})
        # Under the lock, so the reader thread knows the call's ticket before the worker can name it; the
        # ticket is taken after the call is queued, so its "go" follows the call down the pipe.
        with self._lock:
            if self.dead:
                raise WorkerCrashed(self.dead)
            self._pending[call_id] = (loop, future)
            self._outbox.put(data)
            if slots is not None:
                ticket = self._tickets[call_id] = slots.take(lambda: self._outbox.put(go))
        try:
            if ticket is not None:
                await asyncio.wait((ticket.granted, future), return_when=asyncio.FIRST_COMPLETED)
            message = await asyncio.wait_for(future, timeout + HANG_GRACE_SECONDS)
        except TimeoutError:
            reason = f"did not answer within {timeout:g}s"
            self.kill(reason)
            raise WorkerFailure(Failure(TIMEOUT, TimeoutError(f"LLM worker {reason}; killed"))) from None
        except asyncio.CancelledError:
            self._outbox.put(encode({"op": OP_CANCEL, "id": call_id}))
            raise
        finally:
            with self._lock:
                self._pending.pop(call_id, None)
                self._tickets.pop(call_id, None)
            if ticket is not None:
                ticket.release()
        if "failure" in message:
            raise WorkerFailure(failure_from_json(message["failure"]))
        return WorkerAnswer(message["response"], float(message.get("latency_ms") or 0.0))

    def retire(self, reason: str) -> None:
        """Close the worker's stdin: it finishes, drops what it still runs, and exits."""
        self._retire_reason = reason
        self._outbox.put(None)

    def kill(self, reason: str) -> None:
        """SIGKILL the worker (a stuck one cannot be asked); its other calls fail as a crash."""
        self._kill_reason = reason
        try:
            self.process.kill()
        except OSError:
            pass

    def _write(self) -> None:
        stdin = self.process.stdin
        while (data := self._outbox.get()) is not None:
            try:
                stdin.write(data)
                stdin.flush()
            except (OSError, ValueError):
                return  # the worker is gone; the reader reports it
        try:
            stdin.close()
        except OSError:
            pass

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                message = decode(line)
            except ValueError:
                logger.warning("LLM worker {} wrote a line that is not protocol: {!r}", self.process.pid, line[:200])
                continue
            self._route(message)
        self._exit()

    def _read_stderr(self) -> None:
        """What the worker prints (a traceback, a library's warning) goes to the daemon's log, line by line."""
        for raw in self.process.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                for secret in list(self._secrets):
                    line = redact(line, secret)
                logger.warning("LLM worker {}: {}", self.process.pid, redact(line, None)[:STDERR_LINE_LIMIT])

    def _route(self, message: dict) -> None:
        if "ready" in message:
            with self._lock:
                self.ready = True
                waiters, self._ready_waiters = self._ready_waiters, []
            logger.info("LLM worker {} started (litellm ready in {:.1f}s)", self.process.pid,
                        time.monotonic() - self.started)
            for loop, future in waiters:
                settle(loop, future, None)
        elif "log" in message:
            record = message["log"]
            logger.log(str(record.get("level") or "WARNING"), "LLM worker: {}: {}", record.get("name"),
                       record.get("message"))
        elif message.get("released"):
            with self._lock:
                ticket = self._tickets.pop(message.get("id"), None)
                taker = self._tickets.get(message.get("handed_to"))
            if ticket is not None and taker is not None:
                ticket.hand_over(taker)
            elif taker is not None:  # the freed call gave its slot up already: the taker sends over the bound
                taker.claim()
            elif ticket is not None:
                ticket.release()
        elif "id" in message:
            with self._lock:
                waiting = self._pending.pop(message["id"], None)
                ticket = self._tickets.pop(message["id"], None)
            if ticket is not None:
                ticket.release()
            if waiting is not None:
                settle(*waiting, message)

    def _exit(self) -> None:
        """stdout closed: reap the process, log why it went and fail whatever still waits on it."""
        try:
            code = self.process.wait(timeout=EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._outbox.put(None)
        reason = self._kill_reason or (f"exited with status {code}" if code >= 0 else f"was killed by signal {-code}")
        with self._lock:
            self.dead = reason
            waiting = [*self._pending.values(), *self._ready_waiters]
            self._pending.clear()
            self._ready_waiters.clear()
        if waiting or self._retire_reason is None or code != 0:
            logger.warning("LLM worker {} {} after {:.0f}s with {} call(s) waiting", self.process.pid, reason,
                           time.monotonic() - self.started, len(waiting))
        else:
            logger.info("LLM worker {} exited ({}) after {:.0f}s", self.process.pid, self._retire_reason,
                        time.monotonic() - self.started)
        for loop, future in waiting:
            settle(loop, future, WorkerCrashed(reason))
        self.exited.set()
        self._on_exit(self)


def settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, outcome: object) -> None:
    """Resolve *future* on its own loop from a pipe thread: an exception is raised there, anything else
    returned; a future nobody awaits any more, or whose loop has closed, is left alone."""

    def apply() -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    try:
        loop.call_soon_threadsafe(apply)
    except RuntimeError:
        pass
