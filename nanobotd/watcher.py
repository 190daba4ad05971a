"""watchdog observers on session and memory folders, feeding changed paths to the event loop.

nanobot saves sessions by temp file + rename, its file tools write memory in place and editors through swap
files: every change event counts, both ends of a move. inotify drops events on overflow and a recreated folder
leaves a dead watch, so the daemon also reconciles; this module re-arms a watch whose folder changed identity,
and polls when inotify limits are hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path

from loguru import logger
from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from nanobotd.faults import FaultPoints
from nanobotd.sessions.file import is_session_file
from nanobotd.tuning import MAX_DEBOUNCE_FACTOR

INOTIFY_LIMIT_ERRORS = (errno.ENOSPC, errno.EMFILE, errno.ENFILE)
CHANGE_EVENTS = [FileCreatedEvent, FileModifiedEvent, FileClosedEvent, FileMovedEvent, FileDeletedEvent]
# Named fault point (armed by tests): memory events are dropped as an inotify overflow would drop them, so only
# the periodic reconcile can notice the change.
DROP_MEMORY_EVENTS = "watcher.drop_memory_events"


class _Handler(FileSystemEventHandler):
    """Runs on watchdog's thread: only hands the paths *wanted* says are ours over to *deliver*."""

    def __init__(self, wanted: Callable[[Path], bool], deliver: Callable[[Path], None]):
        self.wanted = wanted
        self.deliver = deliver

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        paths = [getattr(event, "dest_path", "") or "", event.src_path]
        for raw in paths:
            if raw:
                path = Path(os.fsdecode(raw))
                if self.wanted(path):
                    self.deliver(path)


class SessionWatcher:
    """One observer for all session and memory folders: session paths debounced per path (a scan follows each),
    memory paths handed on at once (the index refresh has a debounce of its own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[Path], None], *,
                 debounce: float = 1.0, polling: bool = False,
                 on_memory_change: Callable[[Path], None] | None = None, faults: FaultPoints | None = None):
        self.loop = loop
        self.on_change = on_change
        self.on_memory_change = on_memory_change or (lambda path: None)
        self.debounce = debounce
        self.faults = faults or FaultPoints()
        self.mode = "polling" if polling else "inotify"
        self.observer = PollingObserver(timeout=1.0) if polling else Observer()
        self.watches: dict[tuple[Path, bool], tuple[object, int]] = {}  # (folder, memory) -> (watch, inode)
        self._timers: dict[Path, tuple[asyncio.TimerHandle, float]] = {}
        self._handlers = {False: _Handler(is_session_file, lambda path: self._to_loop(self.notify, path)),
                          True: _Handler(lambda path: not self.faults.drops(DROP_MEMORY_EVENTS),
                                         lambda path: self._to_loop(self.on_memory_change, path))}
        self._started = False

    def start(self) -> None:
        """Start the observer thread."""
        self.observer.start()
        self._started = True

    def stop(self) -> None:
        """Stop the observer and drop pending timers."""
        for handle, _ in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._started:
            self.observer.stop()
            self.observer.join(timeout=5)
            self._started = False

    def watch(self, folder: Path, *, memory: bool = False) -> bool:
        """Watch sessions (or *memory*) *folder*, re-arming it when the folder was recreated; False when it does not
        exist."""
        try:
            inode = os.stat(folder).st_ino
        except FileNotFoundError:
            self.unwatch(folder, memory=memory)
            return False
        current = self.watches.get((folder, memory))
        if current is not None and current[1] == inode:
            return True
        if current is not None:
            logger.info("{} folder {} was recreated; re-arming its watch", "memory" if memory else "session", folder)
            self.unwatch(folder, memory=memory)
        try:
            # Reads (opened / closed_no_write) are not changes: nanobot, the index and our own scans read
            # these files, and counting those would keep postponing the debounce.
            handle = self.observer.schedule(self._handlers[memory], str(folder), recursive=False,
                                            event_filter=CHANGE_EVENTS)
        except OSError as exc:
            if exc.errno in INOTIFY_LIMIT_ERRORS and self.mode == "inotify":
                logger.warning("inotify limit reached ({}); switching to the polling observer", exc)
                self._switch_to_polling()
                return self.watch(folder, memory=memory)
            raise
        self.watches[(folder, memory)] = (handle, inode)
        return True

    def unwatch(self, folder: Path, *, memory: bool = False) -> None:
        """Stop watching sessions (or *memory*) *folder*."""
        current = self.watches.pop((folder, memory), None)
        if current is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.observer.unschedule(current[0])

    def _switch_to_polling(self) -> None:
        folders = list(self.watches)
        self.stop()
        self.watches.clear()
        self.mode = "polling"
        self.observer = PollingObserver(timeout=1.0)
        self.start()
        for folder, memory in folders:
            self.watch(folder, memory=memory)

    def healthy(self, folders: list[Path]) -> bool:
        """The observer thread runs and each of the session *folders* is watched, still the folder armed (a memory
        folder gone is no fault of the daemon's: the next reconcile re-arms it; nor is another workspace's folder)."""
        if not self._started or not self.observer.is_alive():
            return False
        for folder in folders:
            try:
                if os.stat(folder).st_ino != self.watches[(folder, False)][1]:
                    return False
            except (KeyError, FileNotFoundError):
                return False
        return True

    # -- debounce (loop side) ------------------------------------------------------------------------
    def _to_loop(self, callback: Callable[[Path], None], path: Path) -> None:
        """From watchdog's thread: *callback*(path) on the loop (none once the loop has closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, path)

    def notify(self, path: Path) -> None:
        """A path changed: (re)start its debounce timer, but never postpone past MAX_DEBOUNCE_FACTOR x."""
        now = self.loop.time()
        handle, first = self._timers.get(path, (None, now))
        if handle is not None:
            handle.cancel()
        delay = max(0.0, min(self.debounce, self.debounce * MAX_DEBOUNCE_FACTOR - (now - first)))
        self._timers[path] = (self.loop.call_later(delay, self._fire, path), first)

    def _fire(self, path: Path) -> None:
        self._timers.pop(path, None)
        self.on_change(path)
