"""Checkpoints of the state database's write-ahead log, run beside the writes instead of inside them.

SQLite checkpoints the WAL itself by default: the commit that takes it past 1,000 pages copies them into
the database and syncs both files before it returns. A first start writes ~150 MB of rows (1,000 sessions),
and those checkpoints were ~0.3 s of its 6 s; a long archive's marks ~0.1 s. Here the store's connection
never checkpoints (wal_autocheckpoint=0): after a commit, a thread of its own checkpoints on a connection of
its own (PASSIVE: it never blocks the writer), at most every INTERVAL_SECONDS while writes go on, so a commit
is on disk within about that long (with synchronous=NORMAL, the WAL is synced at checkpoints). The thread
waits without a timeout between writes and holds no connection then: an idle daemon pays nothing for it.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from loguru import logger

INTERVAL_SECONDS = 0.25  # checkpoints while writes go on, at most this often
WAL_LIMIT_BYTES = 16 << 20  # the log is cut back to this size once checkpointed (it only grows otherwise)


class Checkpointer:
    """Checkpoints one database's WAL after commits, on a thread started at the first."""

    def __init__(self, path: Path, *, interval: float = INTERVAL_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self.checkpoints = 0  # how many were made
        self._written = threading.Event()
        self._stop = threading.Event()  # set once stopped; wakes the thread out of its pause between checkpoints
        self._lock = threading.Lock()  # the thread's start and stop
        self._thread: threading.Thread | None = None

    def written(self) -> None:
        """A commit was made: a checkpoint follows soon."""
        self._written.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="state-checkpoint", daemon=True)
                    self._thread.start()

    def stop(self) -> None:
        """Let the thread finish the checkpoint it is in, and end (the store's close checkpoints what is left)."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        self._written.set()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            self._written.wait()
            if self._stop.is_set():
                return
            self._written.clear()
            self.checkpoint()
            self._stop.wait(self.interval)  # the writes of that time go into the next one

    def checkpoint(self) -> None:
        """Copy the log's committed pages into the database, without waiting for the writer."""
        try:
            db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            logger.debug("state database checkpoint: cannot connect: {}", exc)
            return
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
        except sqlite3.Error as exc:  # busy, or the database went (closed, moved aside): the next one catches up
            logger.debug("state database checkpoint failed: {}", exc)
        finally:
            db.close()
