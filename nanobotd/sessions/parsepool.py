"""Parsing new session files ahead, in parse processes (`parseworker`), while the tracker applies the ones before.

A cold start (an empty state database, or many files never seen) reads every file whole. With the parse and
the counting in child processes, one or two files ahead, the reconciling thread keeps only what must happen in
the daemon: the held copies, the spool and the message cache. A parse is used only for the very version of the
file the tracker then opens (the same inode, size and mtime), so a save in between is read again in the daemon.

Nothing is lost when a process fails: a file whose parse does not come back (the process exited, answered
garbage, or did not answer within its time and was killed) is parsed in the daemon, as without the processes.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from loguru import logger

from nanobotd.sessions.parseworker import Fingerprint, encode, read_item
from nanobotd.sessions.scan import ParseResult
from nanobotd.tokenprocess import EXIT_WAIT_SECONDS, reap, worker_command

PARSE_PROCESSES = 2  # the useful most on two cores (daemon.parse_processes, 0 by default: see the README)
MIN_NEW_FILES = 16  # fewer new files are parsed in the daemon: the processes' start (~0.4 s) would not pay
FILES_AHEAD = 2  # files asked of each process before the tracker takes the first: a few parses in memory
TIMEOUT_SECONDS = 60.0  # a parse not back in this long (plus TIMEOUT_PER_MIB for each MiB) is given up
TIMEOUT_PER_MIB = 1.0
WORKER_MODULE = "nanobotd.sessions.parseworker"

Answer = tuple[Fingerprint, ParseResult]


def processes_for(cpu_count: int | None, most: int = PARSE_PROCESSES) -> int:
    """How many parse processes a machine with *cpu_count* cores runs, *most* at most (daemon.parse_processes;
    0: the daemon parses every file itself, as it does on a single core)."""
    cores = cpu_count or 1
    return max(0, min(most, cores)) if cores >= 2 else 0


class _Parse:
    """One file asked of the processes: its answer, or None when it failed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.answer: Answer | None = None
        self.worker: _Worker | None = None  # the process parsing it
        self.done = threading.Event()

    def finish(self, answer: Answer | None) -> None:
        self.answer = answer
        self.done.set()

    def timeout(self) -> float:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = 0
        return TIMEOUT_SECONDS + TIMEOUT_PER_MIB * size / (1 << 20)


class _Worker:
    """One parse process and the thread that hands it files from the pool's queue, one at a time."""

    def __init__(self, pool: ParsesAhead, command: list[str], number: int) -> None:
        self.pool = pool
        self.failed = False
        # buffered pipes: a read of n bytes waits for all n
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.thread = threading.Thread(target=self._run, name=f"parse-process-{number}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.pool.jobs.get()) is not None:
            job.finish(self._ask(job))
            if self.failed:  # the other processes take the files left, or the daemon once none is left
                self.pool.lost()
                break
        self._close_pipes()

    def _ask(self, job: _Parse) -> Answer | None:
        job.worker = self
        try:
            self.process.stdin.write(encode((str(job.path), self.pool.encoding)))
            self.process.stdin.flush()
            answer = read_item(self.process.stdout)
            fingerprint, parsed = answer
            if fingerprint is not None and not isinstance(parsed, ParseResult):
                raise ValueError(f"a parse of {type(parsed).__name__}")
        except Exception as exc:  # a broken pipe, the end of its output or garbage
            self.failed = True
            self.kill(f"failed ({type(exc).__name__}: {exc})")
            return None
        if fingerprint is None:  # it could not read the file: the daemon tries, and says why if it fails too
            logger.debug("a session parse process could not read {}: {}", job.path, parsed)
            return None
        return fingerprint, parsed

    def kill(self, reason: str) -> None:
        if self.process.poll() is None:
            logger.warning("a session parse process {}; killed, its files are parsed in the daemon", reason)
            self.process.kill()

    def _close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        """Its thread has been told to stop: the process exits once its stdin closes (killed if it does not)."""
        self.thread.join(EXIT_WAIT_SECONDS)
        reap(self.process, self.kill)
        self.thread.join()


class ParsesAhead:
    """New session files parsed by parse processes a few files ahead of the tracker, in the order it reads them.

    `take` is called for every file in its turn: the files this was asked to parse come back in that order,
    any other gets None (the tracker parses it). At most FILES_AHEAD parses a process are asked and not taken.
    """

    def __init__(self, paths: Iterable[Path], encoding: str, processes: int) -> None:
        self.encoding = encoding
        self.jobs: queue.SimpleQueue[_Parse | None] = queue.SimpleQueue()
        self._waiting = list(dict.fromkeys(Path(path) for path in paths))[::-1]  # popped from the end
        self._asked: OrderedDict[Path, _Parse] = OrderedDict()
        self._window = max(1, processes) * FILES_AHEAD
        self._lock = threading.Lock()  # the processes alive, and the files handed to them
        self._workers: list[_Worker] = []
        self._live = 0
        for number in range(processes):
            try:
                worker = _Worker(self, worker_command(WORKER_MODULE), number)
            except OSError as exc:
                logger.warning("cannot start a session parse process: {}; files are parsed in the daemon", exc)
                break
            self._workers.append(worker)
            self._live += 1
        self._ask_more()

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    def take(self, path: Path) -> Answer | None:
        """The parse of *path* and the version it read (waited for); None when it was not asked or failed.
        Parses asked before it and never taken (their files were skipped) are let go."""
        path = Path(path)
        if path not in self._asked:
            return None
        while True:
            first, job = self._asked.popitem(last=False)
            if first == path:
                break
        if not job.done.wait(job.timeout()):
            if job.worker is not None:
                job.worker.kill("did not answer in time")
            job.done.wait(EXIT_WAIT_SECONDS)  # its thread answers None once the pipe ends
        self._ask_more()
        return job.answer

    def _ask_more(self) -> None:
        with self._lock:
            while self._live and self._waiting and len(self._asked) < self._window:
                job = _Parse(self._waiting.pop())
                self._asked[job.path] = job
                self.jobs.put(job)

    def lost(self) -> None:
        """A process failed; once none is left, the files handed over and not parsed go back to the daemon."""
        with self._lock:
            self._live -= 1
            if self._live:
                return
            while True:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    return
                if job is not None:
                    job.finish(None)

    def close(self) -> None:
        """Let the processes go (the ones still parsing finish that file first)."""
        with self._lock:
            self._waiting = []
        for _ in self._workers:
            self.jobs.put(None)
        for worker in self._workers:
            worker.close()
        self._workers = []
