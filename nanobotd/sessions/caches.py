"""The message lists kept in memory: the sessions used last, within a bound; the rest read back when needed."""

from __future__ import annotations

import threading
from collections import OrderedDict

from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.session import SessionState
from nanobotd.state.store import StateStore


class MessageCaches:
    """Which sessions keep their message list (and spool map) in memory: those used last, up to *limit* messages
    in all (the one used last always); its lock is the tracker's."""

    def __init__(self, store: StateStore, lock: threading.RLock, clock, limit: int) -> None:
        self.store, self.lock, self.clock, self.limit = store, lock, clock, limit
        # sessions whose caches are in memory, last used last: when (clock) each was last used and its messages then
        self.used: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.total = 0  # the messages of them all

    def messages(self, session: SessionState) -> MessageList:
        """The session's message list, read from the database when not in memory; it is now the one used last."""
        with self.lock:
            if session.messages is None:
                session.messages = spooldb.read_message_cache(self.store, session.session_id)
            size = len(session.messages)
            _, before = self.used.pop(session.key, (0.0, 0))
            self.used[session.key] = (self.clock(), size)
            self.total += size - before
            return session.messages

    def trim(self, sessions: dict[str, SessionState], keep: SessionState) -> None:
        """Within the limit again: the caches used longest ago go first (only what goes is looked at: a start-up
        reconcile of thousands of small sessions trims after each)."""
        while self.total > self.limit and self.used:
            oldest = next(iter(self.used))
            if oldest == keep.key:
                break
            self.let_go(sessions, oldest)

    def release(self, sessions: dict[str, SessionState], idle_seconds: float) -> int:
        """Let go of the caches unused for *idle_seconds*; returns the entries (messages and spool rows) let go."""
        released = 0
        with self.lock:
            cutoff = self.clock() - idle_seconds
            for key, (used, _) in list(self.used.items()):
                if used > cutoff:
                    break  # last used last: every session after this one was used later
                released += self.let_go(sessions, key)
        return released

    def let_go(self, sessions: dict[str, SessionState], key: str) -> int:
        """Drop one session's caches (message list, spool map, vanished set); returns the entries they held."""
        if key not in self.used:
            return 0
        _, size = self.used.pop(key)
        self.total -= size
        session = sessions.get(key)
        if session is None:
            return 0
        held = len(session.messages or ()) + len(session.spool or ())
        session.messages, session.gone, session.spool = None, None, None
        return held
