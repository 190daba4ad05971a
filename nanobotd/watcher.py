"""watchdog observers on session folders, feeding debounced paths to the event loop.

nanobot saves by temp file + rename, so the event naming the real file is a move's destination.
inotify drops events silently on overflow and a deleted/recreated folder leaves a dead watch behind,
so the daemon also runs a periodic reconcile scan; this module only reports what it sees and can
re-arm a watch whose folder changed identity. When inotify limits are hit it falls back to polling.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
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

from nanobotd.sessions.file import is_session_file

MAX_DEBOUNCE_FACTOR = 5
INOTIFY_LIMIT_ERRORS = (errno.ENOSPC, errno.EMFILE, errno.ENFILE)
CHANGE_EVENTS = [FileCreatedEvent, FileModifiedEvent, FileClosedEvent, FileMovedEvent, FileDeletedEvent]


class _Handler(FileSystemEventHandler):
    """Runs on watchdog's thread: only hands paths over to the loop."""

    def __init__(self, watcher: SessionWatcher):
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        paths = [getattr(event, "dest_path", "") or "", event.src_path]
        for raw in paths:
            if raw:
                path = Path(os.fsdecode(raw))
                if is_session_file(path):
                    self.watcher.notify_threadsafe(path)


class SessionWatcher:
    """One observer for all session folders of the daemon, with per-path debounce."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[Path], None], *,
                 debounce: float = 1.0, polling: bool = False):
        self.loop = loop
        self.on_change = on_change
        self.debounce = debounce
        self.mode = "polling" if polling else "inotify"
        self.observer = PollingObserver(timeout=1.0) if polling else Observer()
        self.watches: dict[Path, tuple[object, int]] = {}
        self.events_seen = 0
        self.last_event: float | None = None
        self._timers: dict[Path, tuple[asyncio.TimerHandle, float]] = {}
        self._handler = _Handler(self)
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

    def watch(self, folder: Path) -> bool:
        """Watch *folder* (re-arming it when the folder was recreated); False when it does not exist."""
        try:
            inode = os.stat(folder).st_ino
        except FileNotFoundError:
            self.unwatch(folder)
            return False
        current = self.watches.get(folder)
        if current is not None and current[1] == inode:
            return True
        if current is not None:
            logger.info("session folder {} was recreated; re-arming its watch", folder)
            self.unwatch(folder)
        try:
            # Reads (opened / closed_no_write) are not changes: nanobot, the index and our own scans read
            # session files, and counting those would keep postponing the debounce.
            handle = self.observer.schedule(self._handler, str(folder), recursive=False, event_filter=CHANGE_EVENTS)
        except OSError as exc:
            if exc.errno in INOTIFY_LIMIT_ERRORS and self.mode == "inotify":
                logger.warning("inotify limit reached ({}); switching to the polling observer", exc)
                self._switch_to_polling()
                return self.watch(folder)
            raise
        self.watches[folder] = (handle, inode)
        return True

    def unwatch(self, folder: Path) -> None:
        """Stop watching *folder*."""
        current = self.watches.pop(folder, None)
        if current is not None:
            try:
                self.observer.unschedule(current[0])
            except (KeyError, ValueError, OSError):
                pass

    def _switch_to_polling(self) -> None:
        folders = list(self.watches)
        self.stop()
        self.watches.clear()
        self.mode = "polling"
        self.observer = PollingObserver(timeout=1.0)
        self.start()
        for folder in folders:
            self.watch(folder)

    def healthy(self) -> bool:
        """The observer thread runs and every watched folder still is the folder we armed."""
        if not self._started or not self.observer.is_alive():
            return False
        for folder, (_, inode) in self.watches.items():
            try:
                if os.stat(folder).st_ino != inode:
                    return False
            except FileNotFoundError:
                return False
        return True

    def health(self) -> dict:
        """Status figures."""
        return {"healthy": self.healthy(), "mode": self.mode, "folders": [str(folder) for folder in self.watches],
                "events_seen": self.events_seen}

    # -- debounce (loop side) ------------------------------------------------------------------------
    def notify_threadsafe(self, path: Path) -> None:
        """Called from watchdog's thread."""
        try:
            self.loop.call_soon_threadsafe(self.notify, path)
        except RuntimeError:
            pass

    def notify(self, path: Path) -> None:
        """A path changed: (re)start its debounce timer, but never postpone past MAX_DEBOUNCE_FACTOR x."""
        self.events_seen += 1
        self.last_event = time.time()
        now = self.loop.time()
        current = self._timers.get(path)
        first = now
        if current is not None:
            current[0].cancel()
            first = current[1]
        delay = self.debounce
        if now - first + delay > self.debounce * MAX_DEBOUNCE_FACTOR:
            delay = max(0.0, self.debounce * MAX_DEBOUNCE_FACTOR - (now - first))
        handle = self.loop.call_later(delay, self._fire, path)
        self._timers[path] = (handle, first)

    def _fire(self, path: Path) -> None:
        self._timers.pop(path, None)
        self.on_change(path)
