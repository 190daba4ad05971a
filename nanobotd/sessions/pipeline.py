"""Scanning many session files in a row, for the session tracker (a start-up reconcile).

`SessionTracker` mixes this in. Each file is read (`_begin_scan`) while the tokens of the two before are
still being counted, then the first of them is applied (`_finish_scan`): the counting (in the counting process or
threads) runs beside the reading instead of after it. The tracker's lock is held a slice of
SCAN_SLICE_SECONDS at a time, every file begun in a slice applied before the lock is let go, so a scan of one
file from the watcher never meets a file half scanned. Files never seen before, when there are many, are read
whole by parse processes a few files ahead (`parsepool`), and the reconciling thread only applies them; they are
applied a group at a time (GROUP_FILES): one transaction, their held copies synced together before it commits.
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
# new files applied together: one transaction, their held copies synced together (a first start's 1,000 files
# spent ~0.7 s waiting for their syncs one at a time, and ~0.3 s committing)
GROUP_FILES = 32
GROUP_MESSAGES = 10_000  # (fewer files when they hold this many messages)


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
        # new files read, applied together when there are enough (many files: the counting process counts)
        group: _Group | None = _Group() if counter is not None else None
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
                    self._finish_oldest(waiting, done, group, keep=FILES_COUNTING)
                else:
                    self._finish_oldest(waiting, done, group)  # in order: the files read before are applied first
                    self._apply_group(group, done)
                    done.append((path, begun))
                if time.perf_counter() >= until:
                    more = True
                    break
            self._finish_oldest(waiting, done, group)
            self._apply_group(group, done)
        finally:
            for begun in [*waiting, *(group.files if group is not None else ())]:  # interrupted: let go unapplied
                begun.close()
        return done, more

    def _finish_oldest(self, waiting: deque[ReadFile], done: list, group: _Group | None, *, keep: int = 0) -> None:
        """Apply the files read first until *keep* are left waiting, each result added to *done* (a new file
        joins *group*, applied with it)."""
        while len(waiting) > keep:
            first = waiting.popleft()
            if group is not None and self._new_session(first):
                group.add(first)
                if group.full():
                    self._apply_group(group, done)
                continue
            self._apply_group(group, done)  # in order
            done.append((first.path, self._finish_caught(first)))

    def _new_session(self, begun: ReadFile) -> bool:
        """A file read whole whose session was never seen (undone whole if its group's commit fails)."""
        return begun.known is None and begun.rows is None and begun.parsed.key not in self.sessions

    def _apply_group(self, group: _Group | None, done: list) -> None:
        """Apply the new files of *group* in one transaction, their held copies synced together before it
        commits. When the commit fails, none of them was applied: their sessions are forgotten (read again at
        the next scan) and each file is reported with the error."""
        if group is None or not group.files:
            return
        files, group.files, group.messages = group.files, [], 0
        results: list[tuple[Path, ScanResult | Exception]] = []
        try:
            with self.store.batch(), self.holds.together():
                for begun in files:
                    results.append((begun.path, self._finish_caught(begun)))
        except Exception as exc:
            self._forget_unapplied(files, [result for _, result in results])
            results = [(begun.path, exc) for begun in files]
        finally:
            for begun in files:
                begun.close()
        done.extend(results)

    def _forget_unapplied(self, files: list[ReadFile], results: list) -> None:
        """The sessions a group's files made, as if never scanned: their rows were rolled back."""
        # the files applied before it failed (none when the transaction could not even begin)
        applied = [(begun, result) for begun, result in zip(files, results, strict=False)
                   if isinstance(result, ScanResult)]
        keys = {result.key for _, result in applied}
        self.large_messages -= sum(begun.parsed.large for begun, _ in applied)  # counted again when read again
        for begun in files:
            self._keys_by_path.pop(begun.path, None)
        for key in keys:
            session = self.sessions.get(key)
            if session is not None:
                self.holds.drop(session.session_id, session.hold_generation)
                self.sessions = {other: kept for other, kept in self.sessions.items() if other != key}
            if key in self._cached:
                self._let_go(key)

    def _finish_caught(self, begun: ReadFile) -> ScanResult | Exception:
        try:
            return self._finish_scan(begun)
        except Exception as exc:
            return exc


class _Group:
    """New files read, to apply together (ScanPipeline._apply_group)."""

    def __init__(self) -> None:
        self.files: list[ReadFile] = []
        self.messages = 0

    def add(self, begun: ReadFile) -> None:
        self.files.append(begun)
        self.messages += len(begun.parsed.messages)

    def full(self) -> bool:
        return len(self.files) >= GROUP_FILES or self.messages >= GROUP_MESSAGES
