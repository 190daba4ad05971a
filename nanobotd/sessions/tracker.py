"""Session tracker: incremental parsing of session files, token accounting and the spool.

A changed file is re-read line by line; a line whose bytes were seen before (same digest) reuses its
parse and token count, so only new messages are decoded and counted. Every conversation message the
agent has not archived and nanobotd has not archived is copied into the spool, so a rewrite that
drops it (`/new`, fork, truncation) cannot lose it: vanished spool rows are handed to the rescue.
Parsing lives in `sessions.scan`, the per-session record and its database row in `sessions.session`,
the spool's rows in `sessions.spool`, the archive marks in `sessions.marks`, the held rows' moves in
`sessions.holding` and the jobs' reads of the spool in `sessions.spoolreads`. Tokens are estimates
(`tokens.estimate_tokens`); `count_tail` counts a session's tail exactly when a decision is near a threshold.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from loguru import logger

from nanobotd import fsio
from nanobotd.faults import FaultPoints
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.hold import Holds
from nanobotd.sessions.holding import SpoolHolding
from nanobotd.sessions.marks import ArchiveMarks
from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import LINE_NEW, ParseResult, parse_session
from nanobotd.sessions.session import (
    ScanResult,
    SessionState,
    archived_twice_count,
    digests_in,
    insert_session,
    load_sessions,
    record_archived_twice,
    save_session,
    store_message_cache,
    vanished_digests,
    vanished_in_spool,
)
from nanobotd.sessions.spoolreads import SpoolReads
from nanobotd.state import bulk
from nanobotd.state.metrics import FLUSH_KIND, MISSED_OUTCOME
from nanobotd.state.store import StateStore
from nanobotd.tokens import count_tokens
from nanobotd.tuning import CACHED_MESSAGES, SCAN_SLICE_SECONDS


def fingerprint_of(stat: os.stat_result) -> tuple[int, int, int]:
    """What tells a version of a session file from another: inode (a rename), size and mtime."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class SessionTracker(ArchiveMarks, SpoolHolding, SpoolReads):
    """Tracks every session file of one workspace; thread-safe (scans run on an executor)."""

    def __init__(self, workspace_name: str, store: StateStore, *, encoding: str = "o200k_base", clock=time.time,
                 cached_messages: int = CACHED_MESSAGES, faults: FaultPoints | None = None):
        self.workspace_name = workspace_name
        self.store = store
        self.encoding = encoding  # what count_tail counts in
        self.clock = clock
        self.cached_messages = cached_messages
        self.faults = faults or FaultPoints()  # "scan.apply": reached before a scan writes what it read
        # Copy-on-write: a scan on the executor replaces the dict instead of growing it, so a reader on the
        # loop iterating `sessions` (GET /v1/sessions, status) always walks a consistent snapshot.
        self.sessions: dict[str, SessionState] = {}
        self.large_messages = 0
        # per session, digest -> leading characters of that message the agent's own cut [RAW] entry holds: an
        # archive run archives only the rest of it (not kept across restarts: the whole message then)
        self.agent_held: dict[str, dict[str, int]] = {}
        self._lock = threading.RLock()
        self._keys_by_path: dict[Path, str] = {}
        # sessions whose caches are in memory, last used last, with when (self.clock) they were last used and
        # how many messages they had then; and the sum of those
        self._cached: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._cached_total = 0
        self.holds = Holds(store.state_dir)
        self._load_sessions()
        swept = self.holds.sweep({session.session_id: session.hold_generation for session in self.sessions.values()})
        if swept:
            logger.info("removed {} held session file version(s) an interrupted scan left behind", swept)

    # -- loading -----------------------------------------------------------------------------------
    def _load_sessions(self) -> None:
        for session in load_sessions(self.store, self.workspace_name):
            self.sessions[session.key] = session
            self._keys_by_path[session.path] = session.key

    def _session_for(self, key: str, path: Path) -> SessionState:
        session = self.sessions.get(key)
        self._keys_by_path[path] = key
        if session is not None:
            if session.path != path:
                self._keys_by_path.pop(session.path, None)
                self._keys_by_path[path] = key
            session.path = path
            return session
        # published in `sessions` once its first scan is applied (a reader never sees it half counted)
        return insert_session(self.store, self.workspace_name, key, path, self.clock())

    def _cached_messages(self, session: SessionState) -> MessageList:
        """The session's message cache, read from the database when not in memory."""
        with self._lock:
            if session.messages is None:
                session.messages = spooldb.read_message_cache(self.store, session.session_id)
            size = len(session.messages)
            _, before = self._cached.pop(session.key, (0.0, 0))
            self._cached[session.key] = (self.clock(), size)  # last used last
            self._cached_total += size - before
            return session.messages

    def _trim_caches(self, keep: SessionState) -> None:
        """Keep the message caches of the sessions used last, up to cached_messages messages (and always
        *keep*'s, used last): the ones used longest ago go first, and are read again from the database when
        next needed. Only what goes is looked at (a start-up reconcile of thousands of small sessions trims
        after every one of them)."""
        while self._cached_total > self.cached_messages and self._cached:
            oldest = next(iter(self._cached))
            if oldest == keep.key:
                break
            self._let_go(oldest)

    def release_idle_caches(self, idle_seconds: float) -> int:
        """Let go of the in-memory caches of the sessions not used for *idle_seconds*: an idle daemon keeps none
        of a long session's ~100 bytes a message; the next scan or job reads them back from the database.
        Returns how many entries (cached messages and spooled rows) were let go."""
        released = 0
        with self._lock:
            cutoff = self.clock() - idle_seconds
            for key, (used, _) in list(self._cached.items()):
                if used > cutoff:
                    break  # last used last: every session after this one was used later
                released += self._let_go(key)
        return released

    def _let_go(self, key: str) -> int:
        """Drop one session's caches (message list, spool map, vanished set); returns the entries they held."""
        _, size = self._cached.pop(key)
        self._cached_total -= size
        session = self.sessions.get(key)
        if session is None:
            return 0
        held = len(session.messages or ()) + len(session.spool or ())
        session.messages, session.gone, session.spool = None, None, None
        return held

    # -- scanning ----------------------------------------------------------------------------------
    def scan(self, path: Path, *, force: bool = False) -> ScanResult | None:
        """Bring one session file's accounting up to date; None when *path* is not a session file."""
        with self._lock:
            return self._scan(Path(path), force=force)

    def scan_many(self, paths: Iterable[Path]) -> Iterator[tuple[Path, ScanResult | None | Exception]]:
        """scan() of each of *paths* in order (a reconcile): yields (path, what scan() returns, or the Exception it
        raised). The lock is held a slice of SCAN_SLICE_SECONDS at a time, so archive marks wait no longer."""
        paths = iter([Path(path) for path in paths])
        more = True
        while more:
            done, more = [], False
            until = time.perf_counter() + SCAN_SLICE_SECONDS
            with self._lock:
                for path in paths:
                    try:
                        done.append((path, self._scan(path)))
                    except Exception as exc:  # reported with this path, in its turn
                        done.append((path, exc))
                    if time.perf_counter() >= until:
                        more = True
                        break
            yield from done

    def _scan(self, path: Path, *, force: bool = False) -> ScanResult | None:
        """Read the file when it changed and apply what is new (under the lock)."""
        started = time.perf_counter()
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return self.forget_path(path)
        known = self._session_by_path(path)
        if known is not None and known.fingerprint == fingerprint_of(stat) and not force:
            return ScanResult(known.key, False)
        try:
            handle = fsio.open_regular(path)
        except OSError as exc:
            logger.warning("cannot read session file {}: {}", path, exc)
            return None
        with handle:
            # the open file is what is read (twice: the parse, then the new lines for the spool), so a rename
            # over the path meanwhile cannot mix two versions
            stat = os.fstat(handle.fileno())
            cached = self._cached_messages(known) if known is not None else None
            parsed = self._parse(path, known, cached, handle)
            if parsed is None:
                return None
            session = self._session_for(parsed.key, path)
            self.faults.reach("scan.apply")
            mark_before = session.agent_archived
            tail_before = session.tail_tokens + 4 * session.unarchived_messages
            vanished = self._apply(session, parsed, fingerprint_of(stat), stat.st_mtime,
                                   appended=parsed.fast and known is session, handle=handle)
        mark_moved = known is session and session.agent_archived > mark_before
        session.corrupt_lines = corrupt = parsed.corrupt
        session.tail = parsed.tail
        key = parsed.key
        self._save_session(session)
        if self.sessions.get(key) is not session:
            self.sessions = {**self.sessions, key: session}
        self._cached_messages(session)
        self._trim_caches(session)
        if corrupt:
            logger.warning("session {}: skipped {} corrupt line(s)", key, corrupt)
        if parsed.large:
            self.large_messages += parsed.large
            logger.warning("session {}: {} message(s) over {} MiB read whole; they are archived raw, in parts",
                           key, parsed.large, sessionfile.MAX_LINE_BYTES >> 20)
        return ScanResult(key, True, parsed.new_count, vanished, corrupt, time.perf_counter() - started,
                          mark_moved, tail_before)

    def count_tail(self, key: str) -> int:
        """The unarchived tail's exact tokens (the messages still in the file), for a decision near a threshold:
        each message is counted once (kept by digest), its text read back from the spool."""
        session = self.sessions.get(key)
        if session is None:
            return 0
        with self._lock:
            spool, gone = self._spool_map(session), self._gone(session)
            exact = {digest: tokens for digest, tokens in (session.exact or {}).items() if digest in spool}
            wanted = {digest for digest in spool if digest not in gone and digest not in exact}
            if wanted:
                seqs = self.store.query_with("SELECT seq, digest FROM spool WHERE session_id=?", (session.session_id,),
                                             lambda rows: [seq for seq, digest in rows if digest in wanted])
                for _, message, _ in self.spooled_messages(key, seqs):
                    text = sessionfile.message_text_for_tokens(message.record, message.text)
                    exact[message.digest] = count_tokens(text, self.encoding)
            session.exact = exact
            total = sum(exact.get(digest, tokens) for digest, tokens in spool.items() if digest not in gone)
            session.exact_tail = (session.unarchived_messages, session.unarchived_tokens, total)
            return total

    def _session_by_path(self, path: Path) -> SessionState | None:
        key = self._keys_by_path.get(path)
        return self.sessions.get(key) if key is not None else None

    def _parse(self, path: Path, known: SessionState | None, cached: MessageList | None, handle: BinaryIO):
        """Read the file; only new messages are decoded (see sessions.scan)."""
        try:
            if known is None:
                result = parse_session(path, handle=handle)
            else:
                result = parse_session(path, cached=cached, tail=known.tail, corrupt_before=known.corrupt_lines,
                                       handle=handle)
        except OSError as exc:
            logger.warning("cannot read session file {}: {}", path, exc)
            return None
        return result

    def _apply(self, session: SessionState, parsed: ParseResult, fingerprint, mtime: float, *, appended: bool = False,
               handle: BinaryIO) -> int:
        """Update counters, the spool and the message cache; return how many spooled messages vanished.

        *appended*: the old messages are an unchanged prefix of the parsed ones (the fast path), so only the
        new ones need looking at.
        """
        header, messages = parsed.header, parsed.messages
        agent_archived = header.last_archived if header.last_archived <= len(messages) else 0
        old = session.messages if session.messages is not None else MessageList()
        same_bytes = appended  # the file still starts with the bytes read last time (where held lines are)
        appended = appended and session.messages is not None and session.agent_archived == agent_archived
        spooled = self._spool_map(session)
        first_fresh = len(old) if appended else 0  # the messages from here on are new to this scan's accounting
        if appended:  # nothing left the file; a message that had may be back
            gone = self._gone(session)
            gone = gone - set(messages.digests(first_fresh)) if gone else set()
        else:
            current = set(messages.digests())
            gone = {digest for digest in spooled if digest not in current}
            del current
        below = set(messages.digests(0, agent_archived)) if agent_archived and spooled else set()
        to_spool = self._spool_rows(session, first_fresh, parsed, agent_archived)
        hold = self._plan_hold(session, parsed, handle, fast=same_bytes,
                               fingerprint=fingerprint,
                               tail_start=session.tail.start if same_bytes and session.tail else None,
                               new_rows=bool(to_spool))
        agent_done = [digest for digest in spooled if digest in below]
        agent_done_tokens = [spooled[digest] for digest in agent_done]
        vanished = 0 if appended else len(gone)
        if not appended and agent_archived:
            self._count_overlap(session, list(messages.digests(0, agent_archived)))
        session.agent_marked = header.marked
        self._write_spool(session, parsed, to_spool, agent_done, old, known_prefix=len(old) if appended else 0,
                          handle=handle, hold=hold)
        session.total_tokens = (session.total_tokens if appended else 0) + messages.total_tokens(first_fresh)
        session.messages = messages
        session.gone = gone
        session.state = "active"
        session.fingerprint = fingerprint
        session.agent_archived = agent_archived
        session.message_count = len(messages)
        session.last_write = mtime
        if appended:
            # the new rows are all in the file; the agent's mark only took rows that were
            session.unarchived_messages += len(to_spool) - len(agent_done)
            session.unarchived_tokens += sum(messages.tokens(index) for index in to_spool) - sum(agent_done_tokens)
        else:
            self._recount(session)
        return vanished

    def _spool_rows(self, session: SessionState, first_fresh: int, parsed: ParseResult,
                    agent_archived: int) -> list[int]:
        """The message numbers to spool: the conversation messages from *first_fresh* on parsed in this scan
        that neither the agent nor nanobotd archived (their rows are made, and their records read, as they are
        written)."""
        spooled = self._spool_map(session)
        if session.skipped:
            return []
        messages = parsed.messages
        wanted = [index for index in range(max(first_fresh, agent_archived), len(messages))
                  if not (messages.flags(index) or messages.digest(index) in spooled)
                  and parsed.lines.kind(index) == LINE_NEW]
        archived = self._archived_among(session, [messages.digest(index) for index in wanted])
        return [index for index in wanted if messages.digest(index) not in archived] if archived else wanted

    def _write_spool(self, session: SessionState, parsed: ParseResult, to_spool: list[int], agent_done: list[str],
                     old: MessageList, *, known_prefix: int, handle: BinaryIO, hold) -> None:
        """Spool the messages numbered *to_spool*, drop those the agent archived, move the held rows (*hold*, a
        HoldPlan), store the message cache: one transaction.

        New rows are held (their lines stay in the held version of the file, open in *handle*) or, when the
        session cannot be held, copied from *handle* a batch at a time, as their lines are.
        """
        now, messages = self.clock(), parsed.messages
        before = (session.hold_generation, session.hold_shift, session.hold_links, session.hold_of)
        try:
            with self.store.transaction() as db:
                self._apply_hold(db, session, hold)
                spooldb.insert_rows(db, session.session_id, parsed.spool_rows(to_spool), handle, now, shift=hold.shift)
                bulk.delete_in(db, "spool", "digest", agent_done, where={"session_id": session.session_id})
                store_message_cache(db, session.session_id, old, messages, known_prefix=known_prefix)
        except BaseException:
            self._undo_hold(session, hold, before)
            raise
        self._finish_hold(session, hold)
        spooled = self._spool_map(session)
        for index in to_spool:
            spooled[messages.digest(index)] = messages.tokens(index)
        for digest in agent_done:
            spooled.pop(digest, None)

    def _count_overlap(self, session: SessionState, agent_archived: list[str]) -> None:
        """Messages under the agent's mark (*agent_archived*, their digests) that nanobotd archived too: counted
        as archived twice."""
        archived = self._archived_among(session, agent_archived)
        twice = [digest for digest in agent_archived if digest in archived]
        if twice and record_archived_twice(self.store, session.session_id, twice, self.clock()):
            logger.warning("session {}: the agent archived {} message(s) nanobotd had archived already",
                           session.key, len(twice))

    def _archived_among(self, session: SessionState, digests: list[str]) -> set[str]:
        """Which of *digests* nanobotd archived, looked up in the database: a session's archive marks are
        not kept in memory (a long session's would be its every message, twice over)."""
        return digests_in(self.store, "archived", session.session_id, digests)

    def _spool_map(self, session: SessionState) -> dict[str, int]:
        """Spooled digests and their tokens (loaded once, then kept in step with the database)."""
        if session.spool is None:
            rows = self.store.query("SELECT digest, tokens FROM spool WHERE session_id=?", (session.session_id,))
            session.spool = dict(rows)
            self._recount(session)  # the running totals start from the spool itself
        return session.spool

    def _recount(self, session: SessionState) -> None:
        """Unarchived = spooled messages still present in the file (vanished ones wait for the rescue).

        A full pass over the spool, for when the file's contents were replaced; the spool's small changes
        in between (archived, respooled) keep the totals running with `_unspool` and `unarchive`.
        """
        spool, gone = self._spool_map(session), self._gone(session)
        live = [tokens for digest, tokens in spool.items() if digest not in gone]
        session.unarchived_messages = len(live)
        session.unarchived_tokens = sum(live)

    def _live(self, session: SessionState, digest: str) -> bool:
        """A spooled message that counts as unarchived: still in the file."""
        return digest not in self._gone(session)

    def _unspool(self, session: SessionState, digests) -> None:
        """Drop *digests* from the in-memory spool, taking the live ones off the running totals."""
        spool = self._spool_map(session)
        for digest in digests:
            tokens = spool.pop(digest, None)
            if tokens is not None and self._live(session, digest):
                session.unarchived_messages -= 1
                session.unarchived_tokens -= tokens

    def vanished_count(self, key: str) -> int:
        """Spooled messages no longer in the session file (in SQL: no message cache is loaded)."""
        session = self.sessions.get(key)
        return vanished_in_spool(self.store, session.session_id) if session is not None else 0

    def _save_session(self, session: SessionState) -> None:
        with self.store.transaction() as db:
            save_session(db, session, self.clock())

    def forget_path(self, path: Path) -> ScanResult | None:
        """A session file disappeared: everything it still had in the spool is now vanished."""
        with self._lock:
            session = self._session_by_path(Path(path))
            if session is None or session.state == "deleted":
                return None
            session.fingerprint = None
            session.state = "deleted"
            session.messages = MessageList()
            session.gone = set(self._spool_map(session))
            session.message_count = 0
            self._recount(session)
            self._save_session(session)
            with self.store.transaction() as db:
                db.execute("DELETE FROM messages WHERE session_id=?", (session.session_id,))
            session.tail = None
            self._release_hold(session)  # no held row left: the deleted file's bytes are not kept
            return ScanResult(session.key, True, 0, len(self._spool_map(session)), 0)

    def _gone(self, session: SessionState) -> set[str]:
        """Spooled digests no longer in the session file: kept in step by each scan, and read from the database
        (the spool rows without a message in the message cache) when the caches were dropped. Only a spooled
        message's presence is asked of it (a session's every digest is not kept in memory for that)."""
        with self._lock:
            if session.gone is None:
                session.gone = set(vanished_digests(self.store, session.session_id))
            return session.gone

    def set_cycle(self, key: str, *, flushed: bool = False, next_cycle: bool = False) -> None:
        """Flush once per compaction cycle: remember the cycle flushed, or start a new cycle. A cycle that ends
        with its flush tried and never done is counted (outcome `missed`, which `observe` shows)."""
        session = self.sessions[key]
        with self._lock:
            if flushed:
                session.flushed_cycle = session.cycle
            if next_cycle:
                if session.flush_failures and session.flushed_cycle != session.cycle:
                    self.store.record_outcome(FLUSH_KIND, self.workspace_name, MISSED_OUTCOME, reason=(
                        f"the compaction came first: {session.flush_failures} flush attempt(s) failed"))
                session.cycle += 1
            if flushed or next_cycle:
                session.flush_failures, session.flush_retry_at = 0, 0.0
            self._save_session(session)

    def flush_failed(self, key: str, retry_at: float) -> int:
        """A flush's LLM call failed: the cycle's flush is still owed, tried again from *retry_at*; returns the
        failures of this cycle so far."""
        session = self.sessions[key]
        with self._lock:
            session.flush_failures += 1
            session.flush_retry_at = retry_at
            return session.flush_failures

    def totals(self) -> dict:
        """Workspace totals for status."""
        sessions = [session for session in self.sessions.values() if not session.skipped]
        live = [session for session in sessions if session.state != "deleted"]
        return {
            "sessions_watched": len(live),
            "unarchived_messages": sum(session.unarchived_messages for session in sessions),
            "unarchived_tokens": sum(session.unarchived_tokens for session in sessions),
            "corrupt_lines": sum(session.corrupt_lines for session in live),
            "large_messages": self.large_messages,
            "archived_twice": archived_twice_count(self.store, self.workspace_name),
        }

    def agent_marks(self) -> bool:
        """Some session file carries the agent's own archive mark: the agent consolidates by itself."""
        return any(session.agent_marked for session in self.sessions.values() if session.state != "deleted")

