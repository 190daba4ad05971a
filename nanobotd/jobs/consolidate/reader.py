"""The daemon's handle on a chunk-reading process (`readworker`), for one archive run without an LLM.

Nothing is lost when the process fails: a chunk whose answer does not come back (the process exited, answered
garbage, or did not answer within READ_TIMEOUT_SECONDS and was killed) is read in the daemon, as is every
chunk after it.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from loguru import logger

from nanobotd.jobs.consolidate.readworker import ReadChunk
from nanobotd.tokenprocess import encode, read_item, reap, worker_command

WORKER_MODULE = "nanobotd.jobs.consolidate.readworker"
READ_TIMEOUT_SECONDS = 60.0  # a chunk fits one LLM request (or is one message): read in milliseconds


class ChunkReader:
    """One chunk-reading process. Chunks are asked as soon as their rows are queried, while the process still reads
    the ones asked before (it is never idle between two of them), and answered in the order asked: each thread
    reads its own answer in its turn."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = READ_TIMEOUT_SECONDS if timeout is None else timeout
        self.failed = False
        self.closed = False  # the run ended
        self._sending = threading.Lock()  # one request written at a time
        self._turns = threading.Condition()  # whose answer is next
        self._asked = self._answered = 0
        self._reading = False  # a thread is reading its answer
        # buffered pipes: a read of n bytes waits for all n
        self.process = subprocess.Popen(worker_command(WORKER_MODULE), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)

    @property
    def pid(self) -> int:
        return self.process.pid

    def read(self, path: Path, shift: int, rows: list[tuple], raw_max_chars: int, backup: Path) -> ReadChunk | None:
        """The chunk of spool *rows* read (and backed up to *backup*) by the process; None when the daemon must
        read it (it could not, or it failed: then every later chunk too)."""
        with self._sending:
            if self.failed:
                return None
            turn, self._asked = self._asked, self._asked + 1
            try:
                self.process.stdin.write(encode((str(path), shift, rows, raw_max_chars, str(backup))))
                self.process.stdin.flush()
            except Exception as exc:  # a broken pipe
                self._fail(exc)
        with self._turns:
            self._turns.wait_for(lambda: self._answered == turn or self.failed)
            self._reading = not self.failed
        try:
            answer = self._answer() if self._reading else None
        finally:
            with self._turns:
                self._answered += 1
                self._reading = False
                self._turns.notify_all()
                self._close_output()
        if isinstance(answer, str):
            logger.debug("a chunk-reading process left a chunk to the daemon: {}", answer)
            return None
        return answer

    def _answer(self) -> ReadChunk | str | None:
        """The next answer, read in this thread's turn (within the timeout); None when the process failed."""
        timer = threading.Timer(self.timeout, self._kill, ("did not answer in time",))
        timer.start()
        try:
            answer = read_item(self.process.stdout)
            if answer is None:
                raise EOFError("its output ended")
            if not isinstance(answer, ReadChunk | str):
                raise ValueError(f"an answer of {type(answer).__name__}")
            return answer
        except Exception as exc:  # the end of its output or garbage
            self._fail(exc)
            return None
        finally:
            timer.cancel()

    def _fail(self, exc: Exception) -> None:
        with self._turns:
            self.failed = True
            self._turns.notify_all()
        self._kill(f"failed ({type(exc).__name__}: {exc})")

    def _kill(self, reason: str) -> None:
        if self.process.poll() is None:
            logger.warning("a chunk-reading process {}; killed, the run's chunks are read in the daemon", reason)
            self.process.kill()

    def close(self) -> None:
        """Let the process go: it exits as its stdin closes (killed at once when chunks asked are still unanswered:
        the run ended without them; killed too if it does not exit), and is reaped; a read still waiting gets the
        end of its output, or no turn."""
        with self._turns:
            self.failed = self.closed = True
            unanswered = self._asked > self._answered
            self._turns.notify_all()
        try:
            self.process.stdin.close()
        except (OSError, ValueError):
            pass
        if unanswered and self.process.poll() is None:
            logger.debug("the run ended with chunks asked of its chunk-reading process unanswered: killed")
            self.process.kill()
        reap(self.process, self._kill)
        with self._turns:
            self._close_output()

    def _close_output(self) -> None:
        """Once the run ended and no thread reads an answer any more, the process's output is closed."""
        if self.closed and not self._reading and not self.process.stdout.closed:
            self.process.stdout.close()
