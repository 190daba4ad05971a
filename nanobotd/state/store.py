"""The state database (SQLite, WAL): session progress, spool, run ledger, outcomes, job state, daily samples.

A cache of what the files say plus nanobotd's own journal: a corrupt or missing file is moved aside and rebuilt
from the files, never fatal. MIGRATIONS only ever move forward.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from loguru import logger

from nanobotd.state import runsteps
from nanobotd.timestamps import iso_local
from nanobotd.tuning import STATE_CACHE_KIB as CACHE_KIB
from nanobotd.tuning import WAL_LIMIT_BYTES

T = TypeVar("T")

DB_NAME = "state.db"
LOCK_NAME = "nanobotd.lock"  # the daemon's lock on the folder (daemon.lock): not state of its own
RUNS_DIR = "runs"
OPEN_RUN_STATES = ("queued", "started")
# Outcomes of finished runs that changed nothing; `nanobotctl runs` hides them unless asked (--all).
# (A consolidation whose summary is "nothing" still archived its messages: outcome "nothing", shown.)
UNCHANGED_OUTCOMES = ("no_change", "skipped_offline")

MIGRATIONS: list[str] = [
    # 1: sessions, cached message list, nanobotd's archive marks, spool, runs, outcomes, job state
    """
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        workspace TEXT NOT NULL,
        key TEXT NOT NULL,
        path TEXT NOT NULL,
        inode INTEGER, size INTEGER, mtime_ns INTEGER,
        agent_archived INTEGER NOT NULL DEFAULT 0,
        messages INTEGER NOT NULL DEFAULT 0,
        corrupt_lines INTEGER NOT NULL DEFAULT 0,
        total_tokens INTEGER NOT NULL DEFAULT 0,
        unarchived_messages INTEGER NOT NULL DEFAULT 0,
        unarchived_tokens INTEGER NOT NULL DEFAULT 0,
        last_write REAL NOT NULL DEFAULT 0,
        flushed_cycle INTEGER NOT NULL DEFAULT -1,
        cycle INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'active',
        updated_at REAL NOT NULL DEFAULT 0,
        UNIQUE (workspace, key)
    );
    CREATE TABLE messages (
        session_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        line_digest TEXT NOT NULL,
        digest TEXT NOT NULL,
        role TEXT NOT NULL,
        timestamp TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        flags INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE archived (
        session_id INTEGER NOT NULL,
        digest TEXT NOT NULL,
        run_id TEXT NOT NULL,
        PRIMARY KEY (session_id, digest)
    );
    CREATE INDEX archived_by_run ON archived (run_id);
    CREATE TABLE spool (
        session_id INTEGER NOT NULL,
        digest TEXT NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        timestamp TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        record TEXT NOT NULL,
        seen_at REAL NOT NULL,
        PRIMARY KEY (session_id, digest)
    );
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        workspace TEXT NOT NULL,
        session_key TEXT,
        state TEXT NOT NULL,
        outcome TEXT,
        started_at REAL NOT NULL,
        finished_at REAL,
        manifest TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX runs_by_kind ON runs (kind, started_at);
    CREATE TABLE outcomes (
        id INTEGER PRIMARY KEY,
        run_id TEXT,
        kind TEXT NOT NULL,
        workspace TEXT NOT NULL,
        outcome TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        tokens INTEGER NOT NULL DEFAULT 0,
        latency_ms REAL,
        at REAL NOT NULL
    );
    CREATE INDEX outcomes_by_time ON outcomes (at);
    CREATE TABLE job_state (
        job TEXT NOT NULL,
        workspace TEXT NOT NULL,
        last_success REAL,
        last_run_id TEXT,
        PRIMARY KEY (job, workspace)
    );
    """,
    # 2: find spooled messages that vanished from their file without loading message caches
    """
    CREATE INDEX messages_by_digest ON messages (session_id, digest);
    CREATE INDEX spool_by_seq ON spool (session_id, seq);
    """,
    # 3: beside an agent that archives by itself: its mark seen, messages both archived, its history read
    """
    ALTER TABLE sessions ADD COLUMN agent_marked INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE archived_twice (
        session_id INTEGER NOT NULL,
        digest TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (session_id, digest)
    );
    CREATE TABLE agent_history (
        workspace TEXT PRIMARY KEY,
        last_cursor INTEGER NOT NULL
    );
    """,
    # 4: the spool refers to messages still in the session file (its version held in held/) instead of
    # copying them: record '' and the line's offsets and digest; the session's held version, shift and kind
    """
    ALTER TABLE spool ADD COLUMN line_start INTEGER;
    ALTER TABLE spool ADD COLUMN line_end INTEGER;
    ALTER TABLE spool ADD COLUMN line_digest TEXT;
    ALTER TABLE sessions ADD COLUMN hold_generation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN hold_shift INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN hold_links INTEGER NOT NULL DEFAULT 0;
    """,
    # 5: a long run's steps journalled one row each (runsteps), not inside a manifest rewritten at every step
    """
    CREATE TABLE run_steps (
        run_id TEXT NOT NULL,
        step INTEGER NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run_id, step)
    );
    """,
    # 6: figures the daemon holds only as they are now, sampled once a day per workspace so the page can chart
    # them over time (metrics.record_daily_sample; the day's latest sample wins)
    """
    CREATE TABLE daily_samples (
        workspace TEXT NOT NULL,
        day TEXT NOT NULL,
        archived_twice INTEGER NOT NULL,
        index_units INTEGER NOT NULL,
        index_db_bytes INTEGER NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (workspace, day)
    );
    """,
    # 7: the message cache a row per block of messages (sessions.messages: MessageList.blocks), not a row per
    # message; the old cache is dropped and every file read whole once more
    """
    DROP TABLE messages;
    CREATE TABLE message_blocks (
        session_id INTEGER NOT NULL,
        first INTEGER NOT NULL,
        line_digests BLOB NOT NULL,
        digests BLOB NOT NULL,
        columns TEXT NOT NULL,
        odd TEXT,
        PRIMARY KEY (session_id, first)
    );
    UPDATE sessions SET inode=NULL, size=NULL, mtime_ns=NULL;
    """,
    # 8: held versions are private copies only (a hard link shared the session file's writes in place): the
    # sessions a link holds are listed for sessions.hold to copy and check at start; each held row's offsets
    # take in its session's shift (a copy is never shifted). hold_shift and hold_links stay, 0 and unused (no
    # DROP COLUMN: SQLite before 3.35 has none)
    """
    CREATE TABLE IF NOT EXISTS held_links (session_id INTEGER PRIMARY KEY);
    INSERT OR IGNORE INTO held_links SELECT id FROM sessions WHERE hold_links != 0 AND hold_generation > 0;
    UPDATE spool SET line_start = line_start + (SELECT hold_shift FROM sessions WHERE id = spool.session_id),
                     line_end = line_end + (SELECT hold_shift FROM sessions WHERE id = spool.session_id)
        WHERE line_digest IS NOT NULL AND session_id IN (SELECT id FROM sessions WHERE hold_shift != 0);
    UPDATE sessions SET hold_shift = 0, hold_links = 0 WHERE hold_shift != 0 OR hold_links != 0;
    """,
    # 9: a long session file seen the first time is held as it is and read when a decision needs its messages
    # (sessions.tracker): until then its counters are estimates from its bytes and it has no spool rows
    """
    ALTER TABLE sessions ADD COLUMN unread INTEGER NOT NULL DEFAULT 0;
    """,
]


@dataclass(frozen=True)
class RunRecord:
    """One row of the run ledger."""

    run_id: str
    kind: str
    workspace: str
    session_key: str | None
    state: str
    outcome: str | None
    started_at: float
    finished_at: float | None
    manifest: dict

    def to_json(self, *, with_manifest: bool = True) -> dict:
        """Plain data for the control API."""
        data = {
            "run_id": self.run_id, "kind": self.kind, "workspace": self.workspace,
            "session_key": self.session_key, "state": self.state, "outcome": self.outcome,
            "started_at": iso_local(self.started_at), "finished_at": iso_local(self.finished_at),
        }
        if with_manifest:
            data["manifest"] = self.manifest
        return data


def new_run_id(kind: str, now: float) -> str:
    """Sortable, readable and unique: r-YYYYmmdd-HHMMSS-<kind>-<6 hex>."""
    return f"r-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{kind[:5]}-{secrets.token_hex(3)}"


class StateStore:
    """All of nanobotd's own state; one connection guarded by a lock, usable from any thread."""

    def __init__(self, state_dir: Path, *, clock=time.time):
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / DB_NAME
        self.clock = clock
        self.rebuilt = False
        self.first_start = False
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._depth = 0  # transactions open on the connection (the lock's holder's): 1, and its savepoints
        self._open_steps: dict[str, dict[int, tuple[str, dict]]] = {}  # open runs' steps decoded (runsteps.steps_of)

    # -- lifecycle -------------------------------------------------------------------------------
    def open(self) -> StateStore:
        """Open (creating or migrating) the database; a corrupt one is moved aside and recreated. `first_start`:
        created in an empty state folder (nothing lost), not recreated beside earlier state (worth a warning)."""
        self.first_start = not self.state_dir.is_dir() or all(entry.name == LOCK_NAME
                                                              for entry in self.state_dir.iterdir())
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.state_dir / RUNS_DIR).mkdir(exist_ok=True, mode=0o700)
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as exc:
            logger.error("state database {} is unusable ({}); moving it aside and rebuilding", self.path, exc)
            self._move_aside()
            self._db = self._connect()
            self.rebuilt = True
            self.first_start = False
        return self

    def shrink_memory(self) -> None:
        """Give the connection's page cache back (it fills again as pages are read): an idle daemon keeps none."""
        with self._lock:
            if self._db is not None:
                self._db.execute("PRAGMA shrink_memory")

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _connect(self) -> sqlite3.Connection:
        fresh = not self.path.exists()
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=OFF")
            db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise sqlite3.DatabaseError(f"schema version {version} is newer than this nanobotd")
            for number in range(version, len(MIGRATIONS)):
                db.executescript("BEGIN;" + MIGRATIONS[number] + f"; PRAGMA user_version={number + 1}; COMMIT;")
            db.execute("SELECT count(*) FROM runs").fetchone()
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            db.execute("PRAGMA shrink_memory")  # the check read every page: none of them is kept for it
        except sqlite3.DatabaseError:
            db.close()
            raise
        if fresh:
            self.rebuilt = True
            os.chmod(self.path, 0o600)
        return db

    def _move_aside(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.path) + suffix)
            if source.exists():
                os.replace(source, Path(f"{self.path}.corrupt-{stamp}{suffix}"))

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on error); inside another on the thread
        that holds it, a savepoint of the outer one (rolled back alone on error), committed with it."""
        with self._lock:
            db = self._require()
            if self._depth:
                yield from self._savepoint(db)
                return
            db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # the block raised, or the commit failed and left it open
                    db.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def _savepoint(self, db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        name = f"nested{self._depth}"
        db.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield db
        except BaseException:
            db.execute(f"ROLLBACK TO {name}")
            db.execute(f"RELEASE {name}")
            raise
        finally:
            self._depth -= 1
        db.execute(f"RELEASE {name}")

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Several reads that see one state: no write of this process comes between them."""
        with self._lock:
            yield

    def query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """Run a read query; rows are tuples."""
        with self._lock:
            return self._require().execute(sql, args).fetchall()

    def query_with(self, sql: str, args: tuple, use: Callable[[Iterable[tuple]], T]) -> T:
        """*use* of a read query's rows as they are fetched (under the store's lock), so a large result is never
        held both as rows and as what they become."""
        with self._lock:
            return use(self._require().execute(sql, args))

    def _require(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("state store is not open")
        return self._db

    # -- run ledger ------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        """The folder holding a run's backups (created on demand)."""
        folder = self.state_dir / RUNS_DIR / run_id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return folder

    def create_run(self, kind: str, workspace: str, *, session_key: str | None = None,
                   manifest: dict | None = None, state: str = "started", run_id: str | None = None) -> str:
        """Journal a run before it touches anything; returns its run_id."""
        run_id = run_id or new_run_id(kind, self.clock())
        with self.transaction() as db:
            db.execute(
                "INSERT INTO runs (run_id, kind, workspace, session_key, state, started_at, manifest)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, kind, workspace, session_key, state, self.clock(), json.dumps(manifest or {})),
            )
        return run_id

    def start_run(self, run_id: str) -> None:
        """A queued run begins."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET state='started', started_at=? WHERE run_id=?", (self.clock(), run_id))

    def journal(self, run_id: str, manifest: dict) -> None:
        """Replace a running run's manifest (write-ahead: called before each step that changes files)."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET manifest=? WHERE run_id=?", (json.dumps(manifest), run_id))

    def journal_steps(self, run_id: str, steps: list[tuple[int, dict]], head: dict) -> None:
        """Journal a few step records of a long run and its manifest's head (see state.runsteps)."""
        with self.transaction() as db:
            runsteps.write_steps(db, run_id, steps, head)

    def finish_run(self, run_id: str, *, state: str, outcome: str, manifest: dict | None = None) -> None:
        """Close a run: state finished | failed | rolled_back, with its outcome."""
        with self.transaction() as db:
            self._open_steps.pop(run_id, None)
            manifest = runsteps.fold_steps(db, run_id, manifest)
            if manifest is None:
                db.execute("UPDATE runs SET state=?, outcome=?, finished_at=? WHERE run_id=?",
                           (state, outcome, self.clock(), run_id))
            else:
                db.execute("UPDATE runs SET state=?, outcome=?, finished_at=?, manifest=? WHERE run_id=?",
                           (state, outcome, self.clock(), json.dumps(manifest), run_id))

    def get_run(self, run_id: str) -> RunRecord | None:
        """One run by id."""
        runs = self._runs("SELECT * FROM runs WHERE run_id=?", (run_id,))
        return runs[0] if runs else None

    def list_runs(self, *, kind: str | None = None, workspace: str | None = None, limit: int = 50,
                  states: tuple[str, ...] | None = None, unchanged: bool = True) -> list[RunRecord]:
        """Newest first; *unchanged* False leaves out the finished runs that changed nothing."""
        where, args = _run_filter(kind, workspace, states, unchanged)
        sql = f"SELECT * FROM runs WHERE {where} ORDER BY started_at DESC, rowid DESC LIMIT ?"
        return self._runs(sql, (*args, limit))

    def _runs(self, sql: str, args: tuple) -> list[RunRecord]:
        """The runs *sql* selects, an open run's journalled steps put back in its manifest."""
        with self._lock:
            db = self._require()
            rows = db.execute(sql, args).fetchall()
            open_runs = [row[0] for row in rows if row[4] in OPEN_RUN_STATES]
            for row in rows:
                if row[4] not in OPEN_RUN_STATES:
                    self._open_steps.pop(row[0], None)
            steps = runsteps.steps_of(db, open_runs, self._open_steps) if open_runs else {}
        return [_run_from_row(row, steps.get(row[0])) for row in rows]

    def count_unchanged_runs(self, *, kind: str | None = None, workspace: str | None = None) -> int:
        """How many finished runs changed nothing, so a listing that hides them can say so."""
        where, args = _run_filter(kind, workspace, ("finished",), True)
        placeholders = ",".join("?" * len(UNCHANGED_OUTCOMES))
        sql = f"SELECT count(*) FROM runs WHERE {where} AND outcome IN ({placeholders})"
        return self.query(sql, (*args, *UNCHANGED_OUTCOMES))[0][0]

    # -- outcomes and job state --------------------------------------------------------------------
    def record_outcome(self, kind: str, workspace: str, outcome: str, *, run_id: str | None = None,
                       reason: str = "", tokens: int = 0, latency_ms: float | None = None) -> None:
        """One row per memory update attempt, normal passes included, so rates have a denominator."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO outcomes (run_id, kind, workspace, outcome, reason, tokens, latency_ms, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, kind, workspace, outcome, reason, tokens, latency_ms, self.clock()),
            )

    def job_last_success(self, job: str, workspace: str) -> tuple[float | None, str | None]:
        """When *job* last completed for *workspace*, and its run id (None when only a catch-up baseline is
        recorded); (None, None) when it never did."""
        rows = self.query("SELECT last_success, last_run_id FROM job_state WHERE job=? AND workspace=?",
                          (job, workspace))
        return tuple(rows[0]) if rows else (None, None)

    def set_job_success(self, job: str, workspace: str, run_id: str | None, when: float | None = None) -> None:
        """Persist a job's success so a run missed while the daemon was down is caught up once."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO job_state (job, workspace, last_success, last_run_id) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (job, workspace) DO UPDATE SET last_success=excluded.last_success,"
                " last_run_id=excluded.last_run_id",
                (job, workspace, when if when is not None else self.clock(), run_id),
            )


def _run_filter(kind: str | None, workspace: str | None, states: tuple[str, ...] | None,
                unchanged: bool) -> tuple[str, list]:
    """The WHERE clause (and its arguments) shared by the run listings."""
    clauses, args = ["1=1"], []
    if kind:
        clauses.append("kind=?")
        args.append(kind)
    if workspace:
        clauses.append("workspace=?")
        args.append(workspace)
    if states:
        clauses.append(f"state IN ({','.join('?' * len(states))})")
        args.extend(states)
    if not unchanged:
        placeholders = ",".join("?" * len(UNCHANGED_OUTCOMES))
        clauses.append(f"NOT (state='finished' AND coalesce(outcome, '') IN ({placeholders}))")
        args.extend(UNCHANGED_OUTCOMES)
    return " AND ".join(clauses), args


def _run_from_row(row: tuple, steps: list[dict] | None = None) -> RunRecord:
    run_id, kind, workspace, session_key, state, outcome, started_at, finished_at, manifest = row
    return RunRecord(run_id, kind, workspace, session_key, state, outcome, started_at, finished_at,
                     runsteps.with_steps(runsteps.read_manifest(manifest), steps))
