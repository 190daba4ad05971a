"""The session tracker: one workspace's session files, what of them is unarchived, and what reached history.

A thin facade over composed parts, each with one reason to change: `sessions.scan` reads a file (only what is
new) into messages; `sessions.spool.Spool` is what is unarchived (rows in the state database, totals in memory);
`sessions.marks.ArchiveMarks` records what reached history; `sessions.hold.Holding` keeps the version of each
file the spool's rows point into; `sessions.caches.MessageCaches` bounds the message lists kept in memory. The
tracker applies a scan to them, one transaction a file (a group of new files together at a first start), and
answers the jobs and the daemon by session key. Tokens are estimates (`tokens.estimate_tokens`); `count_tail`
counts a session's tail exactly when a decision is near a threshold.

A long file seen the first time is held unread (`_hold_unread`): copied as it is, its counters estimated from
its bytes, no line decoded. Every call that needs its messages reads the held copy first (`_ready`), as the
first scan would have read the file; most of a cold start's old sessions never need it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

from loguru import logger

from nanobotd import fsio
from nanobotd.faults import FaultPoints
from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.caches import MessageCaches
from nanobotd.sessions.file import key_from_filename
from nanobotd.sessions.hold import Holding, HoldPlan, worth_a_copy
from nanobotd.sessions.marks import ArchiveMarks
from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import LINE_NEW, Listener, ParseResult, Sketch, parse_session, sketch_session
from nanobotd.sessions.session import (
    SKIPPED_PREFIXES,
    ScanResult,
    SessionState,
    archived_twice_count,
    insert_session,
    load_sessions,
    record_archived_twice,
    save_session,
    store_message_cache,
)
from nanobotd.sessions.spool import Spool
from nanobotd.state import bulk
from nanobotd.state.metrics import FLUSH_KIND, MISSED_OUTCOME
from nanobotd.state.store import StateStore
from nanobotd.tuning import CACHED_MESSAGES, SCAN_SLICE_SECONDS

T = TypeVar("T")


class HeldReader(Protocol):
    """What read_archiving tells of a held copy's messages: each as it is decoded (take), then the end of the read,
    which answers the numbers of the messages it archived (they get no spool row)."""

    take: Listener

    def end(self) -> set[int]: ...


def fingerprint_of(stat: os.stat_result) -> tuple[int, int, int]:
    """What tells a version of a session file from another: inode (a rename), size and mtime."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class SessionTracker:
    """Tracks every session file of one workspace; thread-safe (scans run on an executor)."""

    def __init__(self, workspace_name: str, store: StateStore, *, encoding: str = "o200k_base", clock=time.time,
                 cached_messages: int = CACHED_MESSAGES, faults: FaultPoints | None = None):
        self.workspace_name = workspace_name
        self.store = store
        self.encoding = encoding  # what count_tail counts in
        self.clock = clock
        # "scan.apply": reached before a scan writes what it read; "scan.read_held": inside the read of an unread
        # session's held version, before it commits
        self.faults = faults or FaultPoints()
        # Copy-on-write: a scan on the executor replaces the dict instead of growing it, so a reader on the
        # loop iterating `sessions` (GET /v1/sessions, status) always walks a consistent snapshot.
        self.sessions: dict[str, SessionState] = {}
        self.large_messages = 0
        # per session, digest -> leading characters of that message the agent's own cut [RAW] entry holds: an
        # archive run archives only the rest of it (not kept across restarts: the whole message then)
        self.agent_held: dict[str, dict[str, int]] = {}
        self._lock = threading.RLock()
        self._passes: set[int] = set()  # the sessions whose held copy a pass reads (read_archiving), by id
        self._pass_ends = threading.Condition(self._lock)
        self._keys_by_path: dict[Path, str] = {}
        self.holding = Holding(store, self._lock, self.faults)
        self.spool = Spool(store, self.holding.resolver, self._lock, clock)
        self.marks = ArchiveMarks(store, self.spool, self._lock, clock)
        self.caches = MessageCaches(store, self._lock, clock, cached_messages)
        for session in load_sessions(self.store, self.workspace_name):
            self.sessions[session.key] = session
            self._keys_by_path[session.path] = session.key
        self.holding.sweep(self.sessions.values())

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

    def release_idle_caches(self, idle_seconds: float) -> int:
        """Let go of the in-memory caches of the sessions not used for *idle_seconds* (see MessageCaches.release);
        returns how many entries (cached messages and spooled rows) were let go."""
        return self.caches.release(self.sessions, idle_seconds)

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
            with self._lock:
                done, more = self._scan_slice(paths)
            yield from done

    def _scan_slice(self, paths: Iterator[Path]) -> tuple[list, bool]:
        """Scan paths until the slice's time is up. Files never seen in a row are applied together: one transaction,
        their held copies synced together just before it commits (a first start's thousand files)."""
        done: list[tuple[Path, ScanResult | None | Exception]] = []
        group: ExitStack | None = None
        grouped: list[Path] = []
        until = time.perf_counter() + SCAN_SLICE_SECONDS
        more = False
        try:
            for path in paths:
                if self._session_by_path(path) is None and key_from_filename(path) not in self.sessions:
                    if group is None:
                        group, grouped = ExitStack(), []
                        group.enter_context(self.store.transaction())
                        group.enter_context(self.holding.together())
                    grouped.append(path)
                elif group is not None:
                    done, group = self._commit_group(group, grouped, done), None
                try:
                    done.append((path, self._scan(path)))
                except Exception as exc:  # reported with this path, in its turn
                    done.append((path, exc))
                if time.perf_counter() >= until:
                    more = True
                    break
        except BaseException as exc:  # interrupted: the group is rolled back, its copies closed
            if group is not None:
                group.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return (self._commit_group(group, grouped, done) if group is not None else done), more

    def _commit_group(self, group: ExitStack, paths: list[Path], done: list) -> list:
        """Sync a group's held copies and commit it; when that fails, its new sessions are forgotten (the next
        reconcile reads their files as never seen) and each of its files is reported with the error."""
        try:
            group.close()
        except Exception as exc:
            failed = set(paths)
            for path in paths:
                session = self._session_by_path(path)
                self._keys_by_path.pop(path, None)
                if session is not None:
                    self.holding.forget(session)
                    self.sessions = {key: kept for key, kept in self.sessions.items() if kept is not session}
                    self.caches.let_go(self.sessions, session.key)
            return [(path, exc if path in failed else result) for path, result in done]
        return done

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
        if known is not None and known.unread:  # what changed is told against the version held
            self._read_held(known)
        try:
            handle = fsio.open_regular(path)
        except OSError as exc:
            logger.warning("cannot read session file {}: {}", path, exc)
            return None
        with handle:
            # the open file is what is read (twice: the parse, then the new lines for the spool), so a rename
            # over the path meanwhile cannot mix two versions
            stat = os.fstat(handle.fileno())
            if known is None and (sketch := self._long_and_new(handle, stat)) is not None:
                return self._hold_unread(path, handle, stat, sketch, started)
            try:  # only new messages are decoded (see sessions.scan)
                parsed = parse_session(path, handle=handle) if known is None else parse_session(
                    path, cached=self.caches.messages(known), tail=known.tail, corrupt_before=known.corrupt_lines,
                    handle=handle)
            except OSError as exc:
                logger.warning("cannot read session file {}: {}", path, exc)
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
        self.caches.messages(session)
        self.caches.trim(self.sessions, session)
        self._report(key, parsed)
        return ScanResult(key, True, parsed.new_count, vanished, corrupt, time.perf_counter() - started,
                          mark_moved, tail_before)

    def _report(self, key: str, parsed: ParseResult) -> None:
        if parsed.corrupt:
            logger.warning("session {}: skipped {} corrupt line(s)", key, parsed.corrupt)
        if parsed.large:
            self.large_messages += parsed.large
            logger.warning("session {}: {} message(s) over {} MiB read whole; they are archived raw, in parts",
                           key, parsed.large, sessionfile.MAX_LINE_BYTES >> 20)

    def _long_and_new(self, handle: BinaryIO, stat: os.stat_result) -> Sketch | None:
        """A Sketch of a file seen the first time whose unarchived lines a copy would hold anyway (hold.worth_a_copy),
        under a key of its own (its leading metadata names it); None for the files a scan reads now."""
        if not worth_a_copy(stat.st_size, stat.st_size):
            return None
        sketch = sketch_session(handle)
        key = sketch.header.key
        if key is None or key in self.sessions or not worth_a_copy(sketch.unarchived_bytes, sketch.size):
            return None
        return None if key.startswith(SKIPPED_PREFIXES) else sketch

    def _hold_unread(self, path: Path, handle: BinaryIO, stat: os.stat_result, sketch: Sketch,
                     started: float) -> ScanResult:
        """Hold a long new file as it is, unread: a copy of it, and counters estimated from its bytes. Its lines
        are decoded when a decision needs its messages (_read_held): at a cold start most never are."""
        session = self._session_for(sketch.header.key, path)
        self.faults.reach("scan.apply")
        plan = self.holding.hold_whole(session, handle)
        session.unread, session.state, session.messages, session.gone = True, "active", None, set()
        session.fingerprint, session.last_write = fingerprint_of(stat), stat.st_mtime
        session.agent_archived, session.agent_marked = sketch.agent_archived, sketch.header.marked
        session.message_count, session.total_tokens = sketch.lines, sketch.tokens
        session.unarchived_messages, session.unarchived_tokens = sketch.unarchived_lines, sketch.unarchived_tokens
        try:
            with self.store.transaction() as db:
                self.holding.apply(db, session, plan)
                save_session(db, session, self.clock())
        except BaseException:
            self.holding.undo(session, plan, plan.drop)
            raise
        self.holding.finish(session, plan)
        self.sessions = {**self.sessions, session.key: session}
        return ScanResult(session.key, True, sketch.unarchived_lines, 0, 0, time.perf_counter() - started)

    def _read_held(self, session: SessionState) -> None:
        """Read an unread session's held version as its first scan would have (under the lock): its messages, and
        spool rows held in that same copy. Its fingerprint stays that version's, so a scan of the file compares
        against it as usual. A copy that cannot be read (the state folder damaged) leaves the file to be read
        whole as it is now, at its next scan. A pass reading it already (read_archiving) is waited for."""
        while session.session_id in self._passes:  # the wait lets the lock go
            self._pass_ends.wait()
        if not session.unread:
            return
        handle = self._open_held(session)
        if handle is None:
            return
        with handle:
            self._commit_read(session, handle, parse_session(session.path, handle=handle), frozenset())

    def _open_held(self, session: SessionState) -> BinaryIO | None:
        """The session's held version, open; None when it cannot be read: then its file is read whole at its next
        scan (under the lock)."""
        try:
            return self.holding.open_held(session)
        except OSError as exc:
            logger.error("session {}: its held copy cannot be read ({}); its file is read again as it is now",
                         session.key, exc)
            session.unread, session.fingerprint, session.tail = False, None, None
            self.spool.recount(session)
            self._save_session(session)
            return None

    def _commit_read(self, session: SessionState, handle: BinaryIO, parsed: ParseResult, archived: set[int]) -> None:
        """Apply the read of a held version (under the lock): its messages, and spool rows held in it for what is
        unarchived (less the messages numbered *archived*), one transaction that says the session read."""
        hold = HoldPlan(session.hold_generation, 0)
        try:
            with self.store.transaction() as db:
                self._apply(session, parsed, session.fingerprint, session.last_write, handle=handle, hold=hold,
                            archived=archived)
                session.unread = False
                session.corrupt_lines, session.tail = parsed.corrupt, parsed.tail
                save_session(db, session, self.clock())
                self.faults.reach("scan.read_held")  # its rows written, not committed
        except BaseException:
            session.unread = True
            self.caches.let_go(self.sessions, session.key)
            session.messages, session.spool, session.gone, session.tail = None, None, set(), None
            raise
        self.caches.messages(session)
        self.caches.trim(self.sessions, session)
        self._report(session.key, parsed)
        self.holding.release(session)

    def _ready(self, session: SessionState | None) -> SessionState | None:
        """*session*, its held version read first when it is unread (see _hold_unread)."""
        if session is not None and session.unread:
            with self._lock:
                if session.unread:
                    self._read_held(session)
        return session

    def read_unread(self, key: str) -> None:
        """Read session *key*'s held copy now when it is unread (a job does, on the executor, before it starts)."""
        self._ready(self.sessions.get(key))

    def read_archiving(self, key: str, reader: HeldReader) -> bool:
        """Read session *key*'s held copy when it is unread (False: it is not), telling *reader* of each message as it
        is decoded: what the reader archives meanwhile (its marks through mark_read) gets no spool row; the messages
        its end() returns are left out of the spool, the rest is spooled as by any first read. The copy is decoded
        without the lock (its appends wait for disks); anything else that needs the session read waits for the pass."""
        with self._lock:
            session = self.sessions.get(key)
            while session is not None and session.session_id in self._passes:
                self._pass_ends.wait()
            if session is None or not session.unread or (handle := self._open_held(session)) is None:
                return False
            self._passes.add(session.session_id)
        try:
            with handle:
                parsed = parse_session(session.path, handle=handle, listener=reader.take)
                archived = reader.end()
                with self._lock:
                    if session.session_id not in self._passes:  # let go (let_pass_go): the pass ends here
                        return False
                    self._commit_read(session, handle, parsed, archived)
        finally:
            self.let_pass_go(key)
        return True

    def let_pass_go(self, key: str) -> None:
        """The pass over session *key*'s held copy ended, or its run was stopped (the pass changes nothing more):
        whatever waits for the session to be read reads it now."""
        with self._lock:
            session = self.sessions.get(key)
            if session is not None:
                self._passes.discard(session.session_id)
            self._pass_ends.notify_all()

    def count_tail(self, key: str) -> int:
        """The unarchived tail's exact tokens, for a decision near a threshold (see Spool.count_tail)."""
        session = self._ready(self.sessions.get(key))
        return self.spool.count_tail(session, self.encoding) if session is not None else 0

    def _session_by_path(self, path: Path) -> SessionState | None:
        key = self._keys_by_path.get(path)
        return self.sessions.get(key) if key is not None else None

    def _apply(self, session: SessionState, parsed: ParseResult, fingerprint, mtime: float, *, appended: bool = False,
               handle: BinaryIO, hold: HoldPlan | None = None, archived: set[int] = frozenset()) -> int:
        """Update counters, the spool and the message cache; return how many spooled messages vanished.

        *appended*: the old messages are an unchanged prefix of the parsed ones (the fast path), so only the
        new ones need looking at.
        """
        header, messages = parsed.header, parsed.messages
        agent_archived = header.last_archived if header.last_archived <= len(messages) else 0
        old = session.messages if session.messages is not None else MessageList()
        appended = appended and session.messages is not None and session.agent_archived == agent_archived
        spooled = self.spool.rows(session)
        first_fresh = len(old) if appended else 0  # the messages from here on are new to this scan's accounting
        if appended:  # nothing left the file; a message that had may be back
            gone = self.spool.gone(session)
            gone = gone - set(messages.digests(first_fresh)) if gone else set()
        elif spooled:
            current = set(messages.digests())
            gone = {digest for digest in spooled if digest not in current}
            del current
        else:  # nothing spooled (a file seen for the first time): nothing to miss
            gone = set()
        below = set(messages.digests(0, agent_archived)) if agent_archived and spooled else set()
        to_spool = self._spool_rows(session, first_fresh, parsed, agent_archived, archived)
        if hold is None:
            hold = self.holding.plan(session, parsed, handle, to_spool)
        agent_done = [digest for digest in spooled if digest in below]
        agent_done_tokens = [spooled[digest] for digest in agent_done]
        vanished = 0 if appended else len(gone)
        if not appended and agent_archived:
            self.marks.count_overlap(session, list(messages.digests(0, agent_archived)))
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
            self.spool.recount(session)
        return vanished

    def _spool_rows(self, session: SessionState, first_fresh: int, parsed: ParseResult,
                    agent_archived: int, just_archived: set[int] = frozenset()) -> list[int]:
        """The message numbers to spool: the conversation messages from *first_fresh* on parsed in this scan
        that neither the agent nor nanobotd archived (their rows are made, and their records read, as they are
        written); *just_archived*: numbers of messages known archived already, not looked up."""
        spooled = self.spool.rows(session)
        if session.skipped:
            return []
        messages, lines = parsed.messages, parsed.lines
        begin = max(first_fresh, agent_archived, lines.first)  # a line parsed in this scan (LINE_NEW) counts
        wanted = [begin + at for at, kind in enumerate(lines.kinds[begin - lines.first:]) if kind == LINE_NEW]
        if just_archived:
            wanted = [index for index in wanted if index not in just_archived]
        if spooled:
            wanted = [index for index in wanted if messages.digest(index) not in spooled]
        archived = self.marks.archived_among(session, (messages.digest(index) for index in wanted))
        return [index for index in wanted if messages.digest(index) not in archived] if archived else wanted

    def _write_spool(self, session: SessionState, parsed: ParseResult, to_spool: list[int], agent_done: list[str],
                     old: MessageList, *, known_prefix: int, handle: BinaryIO, hold) -> None:
        """Spool the messages numbered *to_spool*, drop those the agent archived, store the message cache: one
        transaction.

        New rows are held (*hold*, a HoldPlan, made a copy of the version open in *handle* for them) or copied as
        text from *handle* a batch at a time, as their lines are.
        """
        now, messages = self.clock(), parsed.messages
        before = session.hold_generation
        try:
            with self.store.transaction() as db:
                self.holding.apply(db, session, hold)
                added = spooldb.insert_rows(db, session.session_id, parsed.spool_rows(to_spool), handle, now,
                                            shift=hold.shift)
                bulk.delete_in(db, "spool", "digest", agent_done, where={"session_id": session.session_id})
                store_message_cache(db, session.session_id, old, messages, known_prefix=known_prefix)
        except BaseException:
            self.holding.undo(session, hold, before)
            raise
        self.holding.finish(session, hold)
        self.spool.spooled(session, added, agent_done)
        if agent_done:  # the agent archived: maybe the last rows held
            self.holding.release(session)

    def _save_session(self, session: SessionState) -> None:
        with self.store.transaction() as db:
            save_session(db, session, self.clock())

    def forget_path(self, path: Path) -> ScanResult | None:
        """A session file disappeared: everything it still had in the spool is now vanished."""
        with self._lock:
            session = self._session_by_path(Path(path))
            if session is None or session.state == "deleted":
                return None
            if session.unread:  # its messages are all in the held version: spooled, then vanished
                self._read_held(session)
            session.fingerprint = None
            session.state = "deleted"
            session.messages = MessageList()
            session.gone = set(self.spool.rows(session))
            session.message_count = 0
            self.spool.recount(session)
            self._save_session(session)
            with self.store.transaction() as db:
                db.execute("DELETE FROM message_blocks WHERE session_id=?", (session.session_id,))
            session.tail = None
            self.holding.release(session)  # no held row left: the deleted file's bytes are not kept
            return ScanResult(session.key, True, 0, len(self.spool.rows(session)), 0)

    # -- the spool, as the jobs read it ----------------------------------------------------------------
    def pending(self, key: str, *, vanished_only: bool = False) -> list[tuple[int, PendingMessage, bool]]:
        """Spooled messages of a session in first-seen order: (seq, message, still present in the file)."""
        session = self.sessions.get(key) if vanished_only else self._ready(self.sessions.get(key))
        return self.spool.pending(session, vanished_only=vanished_only) if session is not None else []

    def vanished(self, key: str) -> list[str]:
        """The digests of a session's spooled messages no longer in its file, in first-seen order."""
        session = self.sessions.get(key)
        return self.spool.vanished(session) if session is not None else []

    def vanished_count(self, key: str) -> int:
        """Spooled messages no longer in the session file (in SQL: no message cache is loaded)."""
        session = self.sessions.get(key)
        return self.spool.vanished_count(session) if session is not None else 0

    def spool_plan(self, key: str) -> spooldb.SpoolPlan:
        """(seq, role, tokens, still present in the file) of a session's spooled messages, in first-seen order."""
        return self.plan_window(key, spooldb.PlanWindow.oldest)

    def plan_window(self, key: str, use: Callable[[spooldb.PlanWindow], T]) -> T:
        """What *use* makes of a session's plan read a part at a time (`spool.PlanWindow`), as of one state."""
        return self.spool.plan_window(self._ready(self.sessions.get(key)), use)

    def spooled_messages(self, key: str, seqs: list[int]) -> list[tuple[int, PendingMessage, str]]:
        """The spooled messages at *seqs* that are still spooled: (seq, message, its record as JSON text)."""
        session = self._ready(self.sessions.get(key))
        return self.spool.messages(session, seqs) if session is not None else []

    # -- archive marks --------------------------------------------------------------------------------
    def mark_archived(self, key: str, digests: list[str], run_id: str, *, seqs: list[int] | None = None,
                      also: Callable | None = None) -> None:
        """Messages reached history.jsonl: marked archived and out of the spool; *seqs*, their spool sequence
        numbers when known; *also* runs inside the same transaction (a run's journal step)."""
        session = self._ready(self.sessions[key])
        self.marks.record(session, {digest: run_id for digest in digests}, seqs=seqs, also=also)
        self.holding.release(session)

    def mark_read(self, key: str, digests: list[str], tokens: int, run_id: str, *,
                  also: Callable | None = None) -> None:
        """Messages of a session held unread reached history as its held copy was read (read_archiving): marked
        archived, with no spool row to take out; *tokens*, their estimate, leave its counters."""
        with self._lock:  # read meanwhile (a pass that failed marks what it appended after the read's end)
            session = self.sessions[key]
            if not session.unread:
                return self.mark_archived(key, digests, run_id, also=also)
            session.unarchived_messages = max(0, session.unarchived_messages - len(digests))
            session.unarchived_tokens = max(0, session.unarchived_tokens - tokens)
            self.marks.record(session, dict.fromkeys(digests, run_id), also=also, spooled=False)
        return None

    def drop_agent_archived(self, key: str, digests: list[str]) -> None:
        """Messages that left the file and that the agent archived itself: out of the spool, not archived again."""
        session = self._ready(self.sessions[key])
        self.marks.drop_agent_archived(session, digests)
        self.holding.release(session)

    def archived_digests(self, key: str) -> set[str]:
        """The digests of the session's messages nanobotd archived (a few, or none, for a session held unread)."""
        session = self.sessions[key]
        return {digest for (digest,) in self.store.query("SELECT digest FROM archived WHERE session_id=?",
                                                          (session.session_id,))}

    def count_archived_twice(self, key: str, digests: list[str]) -> int:
        """The agent archived messages nanobotd had already archived (its entry came after ours)."""
        return record_archived_twice(self.store, self.sessions[key].session_id, digests, self.clock())

    def apply_history_spans(self, key: str, spans: list[dict]) -> int:
        """Rebuild nanobotd's archive marks from the spans its history entries carry (after a lost DB)."""
        session = self._ready(self.sessions.get(key))
        if session is None:
            return 0
        marked = self.marks.from_spans(session, self.caches.messages(session), spans)
        self.holding.release(session)
        return marked

    def unarchive(self, key: str, run_id: str, records: list[tuple[str, dict, int]]) -> int:
        """Undo an archive run: forget its archive marks and put its messages back in the spool."""
        session = self._ready(self.sessions.get(key))
        if session is None:
            return 0
        restored = self.spool.respool(session, run_id, records)
        with self._lock:
            self._save_session(session)
        return restored

    # -- counters ---------------------------------------------------------------------------------------
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
            "sessions_estimated": sum(session.unread for session in live),
            "unarchived_messages": sum(session.unarchived_messages for session in sessions),
            "unarchived_tokens": sum(session.unarchived_tokens for session in sessions),
            "corrupt_lines": sum(session.corrupt_lines for session in live),
            "large_messages": self.large_messages,
            "archived_twice": archived_twice_count(self.store, self.workspace_name),
        }

    def agent_marks(self) -> bool:
        """Some session file carries the agent's own archive mark: the agent consolidates by itself."""
        return any(session.agent_marked for session in self.sessions.values() if session.state != "deleted")

