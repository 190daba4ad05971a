"""One tracked session file: what is known about it, and its row in the state database's sessions table.

The row keeps the counters and the file identity across restarts; the message cache, digests and spool
map are loaded from their own tables on first use and kept in step by the tracker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import Tail
from nanobotd.state.store import StateStore
from nanobotd.timestamps import iso_local
from nanobotd.tuning import DIGEST_LOOKUP, MESSAGE_BLOCK

SKIPPED_PREFIXES = ("dream:",)
SESSION_COLUMNS = ("id, key, path, inode, size, mtime_ns, agent_archived, messages, corrupt_lines, total_tokens,"
                   " unarchived_messages, unarchived_tokens, last_write, flushed_cycle, cycle, state, agent_marked,"
                   " hold_generation, unread")


@dataclass
class SessionState:
    """Everything known about one session file."""

    session_id: int
    key: str
    path: Path
    fingerprint: tuple[int, int, int] | None = None
    agent_archived: int = 0
    message_count: int = 0
    corrupt_lines: int = 0
    total_tokens: int = 0
    unarchived_messages: int = 0
    unarchived_tokens: int = 0
    last_write: float = 0.0
    flushed_cycle: int = -1
    cycle: int = 0
    state: str = "active"
    agent_marked: bool = False
    hold_generation: int = 0  # the held copy of the file the spool's held rows are in (0: none)
    # held as it was first seen and not read yet: its counters are estimates, it has no spool rows and no
    # message list (the tracker reads the held copy when a decision needs them)
    unread: bool = False
    messages: MessageList | None = None
    # spooled digests no longer in the session file (usually few; None: read from the database when needed)
    gone: set[str] | None = None
    tail: Tail | None = None
    spool: dict[str, int] | None = None
    # this cycle's flushes whose LLM call failed, and when the next may be tried (not kept across restarts)
    flush_failures: int = 0
    flush_retry_at: float = 0.0
    # exact token counts of tail messages, by digest, and the tail's exact total as of (messages, estimate) then
    exact: dict[str, int] | None = None
    exact_tail: tuple[int, int, int] | None = None

    @property
    def tail_tokens(self) -> int:
        """The unarchived tail's tokens: counted exactly when it was last near a threshold and has not changed
        since, estimated otherwise."""
        exact = self.exact_tail
        if exact is not None and exact[:2] == (self.unarchived_messages, self.unarchived_tokens):
            return exact[2]
        return self.unarchived_tokens

    @property
    def skipped(self) -> bool:
        """nanobot's own dream turns are not conversation to archive."""
        return self.key.startswith(SKIPPED_PREFIXES)

    def to_json(self) -> dict:
        """Plain data for the control API."""
        return {
            "key": self.key, "path": str(self.path), "messages": self.message_count,
            "agent_archived": self.agent_archived, "corrupt_lines": self.corrupt_lines,
            "total_tokens": self.total_tokens, "unarchived_messages": self.unarchived_messages,
            "unarchived_tokens": self.tail_tokens, "state": self.state,
            "updated_at": iso_local(self.last_write),
            "compaction_cycle": self.cycle, "flushed_cycle": self.flushed_cycle,
            "estimated": self.unread,  # held unread: its figures are estimates from its bytes until it is read
        }


@dataclass(frozen=True)
class ScanResult:
    """What one scan of one file changed."""

    key: str
    changed: bool
    new_messages: int = 0
    vanished: int = 0
    corrupt_lines: int = 0
    seconds: float = 0.0
    mark_moved: bool = False  # the agent archived in place (its mark advanced over messages still in the file)
    tail_before: int = 0  # the unarchived tail (tokens + 4 a message, as nanobot counts) before this scan


def load_sessions(store: StateStore, workspace_name: str) -> list[SessionState]:
    """Every session of *workspace_name* the database remembers, without their message caches."""
    rows = store.query(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE workspace=?", (workspace_name,))
    sessions = []
    for row in rows:
        (session_id, key, path, inode, size, mtime_ns, agent_archived, messages, corrupt, total, un_msgs,
         un_tokens, last_write, flushed_cycle, cycle, state, agent_marked, generation, unread) = row
        fingerprint = (inode, size, mtime_ns) if inode is not None else None
        sessions.append(SessionState(
            session_id, key, Path(path), fingerprint, agent_archived, messages, corrupt, total, un_msgs,
            un_tokens, last_write, flushed_cycle, cycle, state, bool(agent_marked), generation, bool(unread)))
    return sessions


def insert_session(store: StateStore, workspace_name: str, key: str, path: Path, now: float) -> SessionState:
    """A new session's row (or the existing one of that key), as a fresh SessionState."""
    with store.transaction() as db:
        db.execute("INSERT OR IGNORE INTO sessions (workspace, key, path, updated_at) VALUES (?, ?, ?, ?)",
                   (workspace_name, key, str(path), now))
        session_id = db.execute("SELECT id FROM sessions WHERE workspace=? AND key=?",
                                (workspace_name, key)).fetchone()[0]
    return SessionState(session_id, key, path)


def save_session(db, session: SessionState, now: float) -> None:
    """Write *session*'s counters and file identity back to its row (inside the caller's transaction)."""
    inode, size, mtime_ns = session.fingerprint or (None, None, None)
    db.execute(
        "UPDATE sessions SET path=?, inode=?, size=?, mtime_ns=?, agent_archived=?, messages=?,"
        " corrupt_lines=?, total_tokens=?, unarchived_messages=?, unarchived_tokens=?, last_write=?,"
        " flushed_cycle=?, cycle=?, state=?, agent_marked=?, unread=?, updated_at=? WHERE id=?",
        (str(session.path), inode, size, mtime_ns, session.agent_archived, session.message_count,
         session.corrupt_lines, session.total_tokens, session.unarchived_messages,
         session.unarchived_tokens, session.last_write, session.flushed_cycle, session.cycle,
         session.state, int(session.agent_marked), int(session.unread), now, session.session_id))


def save_hold(db, session: SessionState) -> None:
    """Write *session*'s held version (in the transaction that holds rows in it or lets it go)."""
    db.execute("UPDATE sessions SET hold_generation=? WHERE id=?", (session.hold_generation, session.session_id))


def record_archived_twice(store: StateStore, session_id: int, digests: list[str], now: float) -> int:
    """Remember messages that both the agent and nanobotd archived (each counted once); returns how many are new."""
    if not digests:
        return 0
    with store.transaction() as db:
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO archived_twice (session_id, digest, at) VALUES (?, ?, ?)",
                       [(session_id, digest, now) for digest in digests])
        return db.total_changes - before


def archived_twice_count(store: StateStore, workspace_name: str) -> int:
    """Messages of a workspace archived both by the agent and by nanobotd (the goal is 0)."""
    return store.query("SELECT count(*) FROM archived_twice t JOIN sessions s ON s.id = t.session_id"
                       " WHERE s.workspace=?", (workspace_name,))[0][0]


def digests_in_spans(messages: MessageList, spans: list[dict]) -> dict[str, str]:
    """Digest -> run id of the conversation messages each span (first and last digest, run) covers."""
    position = {digest: index for index, digest in enumerate(messages.digests())}
    marked: dict[str, str] = {}
    for span in spans:
        first, last = position.get(span.get("first")), position.get(span.get("last"))
        if first is None or last is None or last < first:
            continue
        for index in range(first, last + 1):
            if not messages.flags(index):
                marked[messages.digest(index)] = str(span.get("run", "rebuilt"))
    return marked


def store_message_cache(db, session_id: int, old: MessageList, new: MessageList, *,
                        known_prefix: int = 0) -> None:
    """Keep the cached message list in step with the file: rewrite only from the block of the first line that
    differs."""
    prefix = known_prefix
    limit = min(len(old), len(new))
    while prefix < limit and old.line_digest(prefix) == new.line_digest(prefix):
        prefix += 1
    if prefix == len(old) == len(new):
        return
    first = prefix - prefix % MESSAGE_BLOCK
    db.execute("DELETE FROM message_blocks WHERE session_id=? AND first>=?", (session_id, first))
    db.executemany("INSERT INTO message_blocks (session_id, first, line_digests, digests, columns)"
                   " VALUES (?, ?, ?, ?, ?)", ((session_id, *block) for block in new.blocks(first, MESSAGE_BLOCK)))


def digests_in(store: StateStore, table: str, session_id: int, digests: Iterable[str]) -> set[str]:
    """Which of *digests* the session has rows for in *table* ("archived": nanobotd archived them), looked up a
    batch at a time."""
    found: set[str] = set()
    if not store.query(f"SELECT 1 FROM {table} WHERE session_id=? LIMIT 1", (session_id,)):
        return found  # none at all (nothing archived yet: every new session): *digests* need not even be made
    digests = list(digests)
    for first in range(0, len(digests), DIGEST_LOOKUP):
        batch = digests[first:first + DIGEST_LOOKUP]
        found.update(row[0] for row in store.query(
            f"SELECT digest FROM {table} WHERE session_id=? AND digest IN ({','.join('?' * len(batch))})",
            (session_id, *batch)))
    return found
