"""Scanning many session files in a row, for the session tracker (a start-up reconcile).

`SessionTracker` mixes this in. Each file is read (`_begin_scan`) while the tokens of the two before are
still being counted, then the first of them is applied (`_finish_scan`): the counting (in the counting process or
threads) runs beside the reading instead of after it. The tracker's lock is held a slice of
SCAN_SLICE_SECONDS at a time, every file begun in a slice applied before the lock is let go, so a scan of one
file from the watcher never meets a file half scanned. Files never seen before, when there are many, are read
whole by parse processes a few files ahead (`parsepool`), and the reconciling thread only applies them.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nanobotd.sessions import parsepool
from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import Counter, ParseResult
from nanobotd.sessions.scanrows import ScanRows
from nanobotd.sessions.session import ScanResult, SessionState

SCAN_SLICE_SECONDS = 0.25  # scan_many holds the lock this long at a time (archive marks wait for it)
FILES_COUNTING = 2  # files read whose tokens are still being counted, before the first of them is applied


@dataclass
class ReadFile:
    """A session file read by the tracker's _begin_scan, still open, its parse to apply by _finish_scan."""

    path: Path
    handle: BinaryIO
    fingerprint: tuple[int, int, int]
    mtime: float
    known: SessionState | None  # the session the path had when it was read
    cached: MessageList | None  # its message cache then
    parsed: ParseResult
    started: float
    rows: ScanRows | None = None  # its rows written while it was read (scanrows), when it is long

    def close(self) -> None:
        """Let the file and its rows go (applied, or given up)."""
        try:
            self.handle.close()
        finally:
            if self.rows is not None:
                self.rows.close()


class ScanPipeline:
    """scan_many (the tracker's _lock, counter, _stale, _begin_scan and _finish_scan are used as is)."""

    def scan_many(self, paths: Iterable[Path]) -> Iterator[tuple[Path, ScanResult | None | Exception]]:
        """scan() of each of *paths* in order, each file read while the tokens of the two before are still
        being counted (tiktoken counts without the GIL): a start-up reconcile of many files.

        Yields (path, what scan() returns, or the Exception it raised). The lock is held a slice of
        SCAN_SLICE_SECONDS at a time, every file begun in it finished before it is let go. When two files or
        more are to be read, the tracker's counter (the counting process) counts; beside one file, only when
        much of it is unread (tracker.PROCESS_SCAN_BYTES): a save's few lines are counted by the threads.
        Many files never seen (a cold start) are parsed and counted ahead by the tracker's parse processes.
        """
        paths = [Path(path) for path in paths]
        stale = (path for path in paths if self._stale(path))
        counter = self.counter if len(list(itertools.islice(stale, 2))) == 2 else None
        ahead = self._parses_ahead(paths)
        remaining = iter(paths)
        more = True
        try:
            while more:
                with self._lock:
                    done, more = self._scan_slice(remaining, counter, ahead)
                yield from done
        finally:
            if ahead is not None:
                ahead.close()

    def _parses_ahead(self, paths: list[Path]) -> parsepool.ParsesAhead | None:
        """Parse processes for the files never seen, when there are enough of them (a cold start)."""
        if not self.parse_processes:  # the default: a periodic reconcile does not even look
            return None
        new = [path for path in paths if self._session_by_path(path) is None]
        if len(new) < parsepool.MIN_NEW_FILES:
            return None
        return parsepool.ParsesAhead(new, self.encoding, self.parse_processes)

    def _scan_slice(self, paths: Iterator[Path], counter: Counter | None,
                    ahead: parsepool.ParsesAhead | None = None) -> tuple[list, bool]:
        """Scan paths until the slice's time is up; returns what was scanned and whether paths are left."""
        done: list[tuple[Path, ScanResult | None | Exception]] = []
        until = time.perf_counter() + SCAN_SLICE_SECONDS
        waiting: deque[ReadFile] = deque()  # read, their counts still coming: applied in order
        more = False
        try:
            for path in paths:
                try:
                    parsed = ahead.take(path) if ahead is not None else None
                    begun = self._begin_scan(path, defer_counts=True, counter=counter, ahead=parsed)
                except Exception as exc:  # reported with this path, in its turn
                    begun = exc
                if isinstance(begun, ReadFile):
                    waiting.append(begun)
                    self._finish_oldest(waiting, done, keep=FILES_COUNTING)
                else:
                    self._finish_oldest(waiting, done)  # in order: the files read before are applied first
                    done.append((path, begun))
                if time.perf_counter() >= until:
                    more = True
                    break
            self._finish_oldest(waiting, done)
        finally:
            for begun in waiting:  # interrupted: the files read are let go unapplied
                begun.close()
        return done, more

    def _finish_oldest(self, waiting: deque[ReadFile], done: list, *, keep: int = 0) -> None:
        """Apply the files read first until *keep* are left waiting, each result added to *done*."""
        while len(waiting) > keep:
            first = waiting.popleft()
            done.append((first.path, self._finish_caught(first)))

    def _finish_caught(self, begun: ReadFile) -> ScanResult | Exception:
        try:
            return self._finish_scan(begun)
        except Exception as exc:
            return exc
