"""The daemon's handle on its counting process (`tokenworker`): started when a scan has much to count.

The counting threads encode without the GIL, but every text takes the GIL twice; beside a scan busy in
Python each take waits, so when a reconcile reads several files (`sessions.pipeline`: a cold start's
thousands of new messages), or one file has a long stretch unread (`tracker.PROCESS_SCAN_BYTES`: a long
session seen for the first time), their batches are counted here instead, by a child process with a GIL of
its own, and the daemon loads no encoding for them. A save's scan never uses it, and a reconcile only once
it has handed over PROCESS_AFTER_TEXTS texts. The workspace lets it go once the scan or reconcile is done
(the daemon's idle check after `idle_seconds` otherwise), and it dies with the daemon (its stdin closes).

A batch whose process exits, or does not answer within RESULT_TIMEOUT_SECONDS (the process is then
killed), is counted in the daemon instead: a count is never lost, only slower.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loguru import logger

from nanobotd.tokens import PendingCounts, count_tokens_batch, submit_tokens_batch
from nanobotd.tokenworker import LENGTH, encode_request, read_exactly

PROCESS_AFTER_TEXTS = 128  # texts handed over before it starts: a reconcile of a few small saves never does
RESULT_TIMEOUT_SECONDS = 120.0  # a batch is 128 texts of at most MAX_COUNTED_CHARS: seconds at worst
EXIT_WAIT_SECONDS = 5.0
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def worker_command(module: str = "nanobotd.tokenworker", entry: str = "serve") -> list[str]:
    """This interpreter serving the daemon on stdin and stdout with *module*'s *entry* (`tokenworker`'s serve by
    default; "serve" is handed both streams, another entry takes no argument), with this package importable
    whatever the working directory."""
    call = "serve(sys.stdin.buffer, sys.stdout.buffer)" if entry == "serve" else f"{entry}()"
    bootstrap = (f"import sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r}); from {module} import {entry}; "
                 f"sys.exit({call})")
    return [sys.executable, "-c", bootstrap]


def reap(process: subprocess.Popen, kill: Callable[[str], None], reason: str = "did not exit") -> None:
    """Wait for a child told to go (its stdin closed, or its output ended) to exit; *kill* it with *reason* when it
    does not within EXIT_WAIT_SECONDS, then wait (no zombie is left)."""
    try:
        process.wait(EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        kill(reason)
        process.wait()


def counting_processes() -> int:
    """How many counting processes this daemon has alive now, every workspace's (one holds an encoding, ~57 MB:
    a job that would start a child of its own beside one may wait for it to go)."""
    return sum(child.process.poll() is None for child in list(_Child.started))


class ProcessCounts:
    """The counts of one batch sent to the counting process (or, when it failed, counted here)."""

    def __init__(self, child: _Child, texts: list[str], encoding_name: str) -> None:
        self._child = child
        self._texts = texts
        self._encoding_name = encoding_name
        self._counts: list[int] | None = None
        self._answered = threading.Event()

    def answer(self, counts: list[int] | None) -> None:
        """The process's counts, or None: it failed (result() counts here)."""
        self._counts = counts
        self._answered.set()

    def result(self) -> list[int]:
        """Every text's count, as count_tokens_batch gives it."""
        if not self._answered.wait(self._child.result_timeout):
            self._child.kill("did not answer a batch in time")
            self._answered.wait(EXIT_WAIT_SECONDS)  # the reader answers None once the pipe ends
        if self._counts is None or len(self._counts) != len(self._texts):
            return count_tokens_batch(self._texts, self._encoding_name)
        return self._counts


class _Child:
    """One counting process: batches are written in order and answered in that order."""

    started: weakref.WeakSet[_Child] = weakref.WeakSet()  # every workspace's, for counting_processes()

    def __init__(self, command: list[str], result_timeout: float) -> None:
        self.result_timeout = result_timeout
        # buffered pipes: a read of n bytes waits for all n (a raw pipe may hand over part of an answer)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        _Child.started.add(self)
        self.waiting: deque[ProcessCounts] = deque()  # sent, not answered: the reader answers the first
        self.preload: ProcessCounts | None = None  # the empty batch that loads its encoding before any other
        self.failed = False
        self._send = threading.Lock()
        # a writer thread feeds the pipe, so a scan never waits for the process to take the next batch
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="tokens-process-in", daemon=True)
        self._reader = threading.Thread(target=self._read, name="tokens-process-out", daemon=True)
        self._writer.start()
        self._reader.start()

    def send(self, texts: list[str], encoding_name: str) -> ProcessCounts:
        pending = ProcessCounts(self, texts, encoding_name)
        request = encode_request(texts, encoding_name)
        with self._send:  # answered in the order written
            if self.failed:  # the reader has ended: nobody would answer it
                pending.answer(None)
            else:
                self.waiting.append(pending)
                self._requests.put(request)
        return pending

    def busy(self) -> bool:
        """A batch sent is not answered yet (the empty one loading the encoding aside: nothing waits for it)."""
        return any(pending is not self.preload for pending in list(self.waiting))

    def _write(self) -> None:
        while (request := self._requests.get()) is not None:
            try:
                self.process.stdin.write(request)
                self.process.stdin.flush()
            except (OSError, ValueError):  # it died: the reader answers every batch waiting with None
                self.kill("could not be written to")
                return
        try:
            self.process.stdin.close()  # the process finishes what it has, then exits
        except OSError:
            pass

    def _read(self) -> None:
        stream = self.process.stdout
        try:
            while (head := read_exactly(stream, LENGTH.size)) is not None:
                (count,) = LENGTH.unpack(head)
                data = read_exactly(stream, LENGTH.size * count)
                if data is None or not self.waiting:
                    break
                counts = array("I")
                counts.frombytes(data)
                self.waiting.popleft().answer(counts.tolist())
        except (OSError, ValueError):
            pass
        with self._send:  # a batch sent from now on is answered None at once
            self.failed = True
            while self.waiting:  # what it took with it is counted in the daemon
                self.waiting.popleft().answer(None)
        self._reap()

    def _reap(self) -> None:
        """Its output ended: it exits (or is made to), and is waited for (no zombie is left)."""
        reap(self.process, self.kill, "closed its output but did not exit")

    def kill(self, reason: str) -> None:
        if self.process.poll() is None:
            logger.warning("the token counting process {}; killed, its batches are counted in the daemon", reason)
            self.process.kill()

    def close(self) -> None:
        """Let it finish and exit (its stdin closed), killed if it does not; killed at once when all it has to
        finish is loading its encoding (started early, and no batch came)."""
        if self.waiting and not self.busy() and self.process.poll() is None:
            self.process.kill()
        self._requests.put(None)
        reap(self.process, self.kill)
        self._writer.join(EXIT_WAIT_SECONDS)
        self._reader.join(EXIT_WAIT_SECONDS)
        self.process.stdout.close()


class CountingProcess:
    """Counts batches of texts in a child process once a scan has handed over PROCESS_AFTER_TEXTS of them;
    before that, and after a failure until it is let go, in the daemon's counting threads."""

    def __init__(self, command: list[str] | None = None, *, after_texts: int = PROCESS_AFTER_TEXTS,
                 result_timeout: float = RESULT_TIMEOUT_SECONDS) -> None:
        self.command = command or worker_command()
        self.after_texts = after_texts
        self.result_timeout = result_timeout
        self.starts = 0
        self._child: _Child | None = None
        self._handed = 0
        self._last_used = 0.0
        self._users = 0  # scans and reconciles under way that may hand it batches (in_use)
        self._lock = threading.Lock()

    def submit(self, texts: list[str], encoding_name: str) -> ProcessCounts | PendingCounts:
        """The counts of *texts*, counted while the caller goes on; result() on the answer waits for them."""
        with self._lock:
            self._last_used = time.monotonic()
            self._handed += len(texts)
            child = self._child
            if child is None and self._handed >= self.after_texts:
                child = self._child = self._start()
        if child is None or child.failed:
            return submit_tokens_batch(texts, encoding_name)
        return child.send(texts, encoding_name)

    def start_now(self, encoding_name: str) -> bool:
        """Start the process before any batch, its encoding loading meanwhile (a first start's reconcile will need
        it: its ~0.3 s start then overlaps the daemon's own); let go as usual if no batch comes."""
        with self._lock:
            self._last_used = time.monotonic()
            if self._child is None:
                self._child = self._start()
            child = self._child
        if child is None:
            return False
        child.preload = child.send([], encoding_name)  # an empty batch: the encoding is loaded, nothing is counted
        return True

    def _start(self) -> _Child | None:
        try:
            child = _Child(self.command, self.result_timeout)
        except OSError as exc:
            logger.warning("cannot start the token counting process: {}; counting in the daemon", exc)
            return None
        self.starts += 1
        logger.debug("started the token counting process (pid {})", child.process.pid)
        return child

    @property
    def running(self) -> bool:
        """A counting process is alive."""
        child = self._child
        return child is not None and child.process.poll() is None

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None else None

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """Around a scan or reconcile that may hand it batches: when the last of them is done, the process is let
        go (its encoding, ~45-65 MB, is not kept beside the run the scan triggers; the next long stretch starts
        it again in ~0.3 s)."""
        with self._lock:
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                last = self._users == 0
            if last and self.stop_if_idle(0.0):
                logger.debug("the token counting process is done: let go")

    def stop_if_idle(self, idle_seconds: float) -> bool:
        """Let the process go when no batch came for *idle_seconds* (and none is waiting)."""
        with self._lock:
            child = self._child
            if child is None or child.busy() or time.monotonic() - self._last_used < idle_seconds:
                return False
            self._child, self._handed = None, 0
        child.close()
        return True

    def close(self) -> None:
        """Let the process go now (the daemon stops)."""
        with self._lock:
            child, self._child, self._handed = self._child, None, 0
        if child is not None:
            child.close()
