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
from nanobotd.sessions.parseworker import encode, read_item
from nanobotd.tokenprocess import reap, worker_command

WORKER_MODULE = "nanobotd.jobs.consolidate.readworker"
READ_TIMEOUT_SECONDS = 60.0  # a chunk fits one LLM request (or is one message): read in milliseconds


class ChunkReader:
    """One chunk-reading process: a chunk at a time is asked and answered (by one thread at a time)."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = READ_TIMEOUT_SECONDS if timeout is None else timeout
        self.failed = False
        self.closed = False  # the run ended
        self._lock = threading.Lock()  # one request and its answer at a time
        # buffered pipes: a read of n bytes waits for all n
        self.process = subprocess.Popen(worker_command(WORKER_MODULE), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)

    @property
    def pid(self) -> int:
        return self.process.pid

    def read(self, path: Path, shift: int, rows: list[tuple], raw_max_chars: int, backup: Path) -> ReadChunk | None:
        """The chunk of spool *rows* read (and backed up to *backup*) by the process; None when the daemon must
        read it (it could not, or it failed: then every later chunk too)."""
        with self._lock:
            if self.failed:
                return None
            timer = threading.Timer(self.timeout, self._kill, ("did not answer in time",))
            timer.start()
            try:
                self.process.stdin.write(encode((str(path), shift, rows, raw_max_chars, str(backup))))
                self.process.stdin.flush()
                answer = read_item(self.process.stdout)
                if answer is None:
                    raise EOFError("its output ended")
                if not isinstance(answer, ReadChunk | str):
                    raise ValueError(f"an answer of {type(answer).__name__}")
            except Exception as exc:  # a broken pipe, the end of its output or garbage
                self.failed = True
                self._kill(f"failed ({type(exc).__name__}: {exc})")
                return None
            finally:
                timer.cancel()
        if isinstance(answer, str):
            logger.debug("a chunk-reading process left a chunk to the daemon: {}", answer)
            return None
        return answer

    def _kill(self, reason: str) -> None:
        if self.process.poll() is None:
            logger.warning("a chunk-reading process {}; killed, the run's chunks are read in the daemon", reason)
            self.process.kill()

    def close(self) -> None:
        """Let the process go: it exits as its stdin closes, once the chunk it is reading (if any) is answered
        (killed if it does not exit), and is reaped; a read still waiting gets the end of its output."""
        self.failed = self.closed = True
        try:
            self.process.stdin.close()
        except (OSError, ValueError):
            pass
        reap(self.process, self._kill)
        if self._lock.acquire(blocking=False):  # no read in flight: its output is closed here
            try:
                self.process.stdout.close()
            finally:
                self._lock.release()
