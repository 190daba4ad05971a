"""The builtin search index: SQLite FTS5 over a workspace's memory, history and session transcripts, one DB each.
Only sources whose (inode, size, mtime_ns) changed are re-read, and only their units with new keys indexed: a growing
session costs hashing, not re-indexing. Synchronous (the daemon calls it from an executor thread; one lock serialises
the connection); a damaged database is rebuilt, as it holds only what the workspace can give again."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from loguru import logger

from nanobotd.fsio import read_text_lossy
from nanobotd.index import ftsdb
from nanobotd.index.hit import SearchHit
from nanobotd.index.query import parse_query
from nanobotd.index.ranking import build_hits
from nanobotd.index.searching import ranked_units, score_rows
from nanobotd.index.selectivity import MATCH_BUDGET, ClauseSelector
from nanobotd.index.sessionunits import STRIDE, WINDOW, is_skipped_session, session_key_for, session_units
from nanobotd.index.sources import SourceSet, file_fingerprint
from nanobotd.index.stems import Stemmer
from nanobotd.index.units import (
    HISTORY_UNIT_CHARS,
    MAX_UNIT_CHARS,
    Unit,
    history_units,
    iso_seconds,
    markdown_units,
    note_date,
    parse_timestamp,
    unit_dates,
)
from nanobotd.index.vectors import MAX_EMBED_PER_REFRESH, Embed, VectorIndex, with_vectors
from nanobotd.tuning import CANDIDATES_PER_HIT, MIN_CANDIDATES

MAX_MARKDOWN_BYTES = 32 * 1024 * 1024
INSERT_BATCH = 500
MAX_LIMIT = 500
# Bump when the way files become units changes: an index made the old way is then rebuilt
# (2: the dates column holds a key per day and month; 3: calls of nanobotd's memory tools left out, and
# the dates column holds the days a text names as well as its own; 4: windows sized in characters;
# 5: the dates column holds only the keys; 6: "last night" and weekends are dated).
UNITS_VERSION = 6


class BuiltinIndex:
    """Search over one workspace: refresh incrementally, search with BM25 plus date and overlap handling."""

    def __init__(self, workspace: Path, db_path: Path, sessions_dirs: Path | Iterable[Path] | None = None, *,
                 clock: Callable[[], datetime] = datetime.now, window: int = WINDOW, stride: int = STRIDE,
                 match_budget: int = MATCH_BUDGET, embed: Embed | None = None):
        one_folder = isinstance(sessions_dirs, (str, Path))
        self.sources = SourceSet(workspace, (sessions_dirs,) if one_folder else sessions_dirs or ())
        self.workspace = self.sources.workspace
        self.db_path = Path(db_path)
        self.window, self.stride = window, stride
        self._clock = clock
        self._lock = threading.RLock()
        self._reading = threading.Lock()
        self._read_connection: sqlite3.Connection | None = None
        self._last_stats: dict = {}
        # Set when a damaged database was replaced by an empty one: the next call fills it again.
        self._refill = False
        self._selector = ClauseSelector(match_budget)
        self._stemmer = Stemmer()
        # Optional embeddings (search.embeddings): fused with BM25 when the model answers.
        self._vectors = VectorIndex(embed) if embed is not None else None
        self._units = 0
        self._layout = f"v{UNITS_VERSION} window={window} stride={stride} chars={MAX_UNIT_CHARS}/{HISTORY_UNIT_CHARS}"
        self._connection: sqlite3.Connection | None = None
        try:
            self._connection = self._open()
        except sqlite3.Error as exc:  # the index is a cache: the daemon starts, and a refresh opens it again
            logger.warning("search index {} cannot be opened now ({}); a refresh will try again", self.db_path, exc)

    # -- public interface -------------------------------------------------------------------------

    def set_sessions_dirs(self, folders: Iterable[Path]) -> None:
        """Cover exactly these sessions folders; a change makes the next refresh check every file. No lock: called at
        every reconcile, it must not wait for a refresh; a refresh sees the old tuple or the new (swaps are atomic)."""
        if self.sources.set_sessions_dirs(folders):
            self._refill = True

    def refresh(self, changed: Iterable[Path] | None = None) -> dict:
        """Re-index what changed: every source by fingerprint (None), or exactly the given paths."""
        with self._lock:
            paths = None if changed is None or self._refill else list(changed)
            totals = self._with_recovery(lambda: self._refresh(paths), lambda: self._refresh(None))
        if self._vectors is not None:
            totals["units_embedded"] = self._embed_pending()
        return totals

    def stale_files(self) -> list[Path]:
        """Covered files changed, new or gone since the index saw them: what the watcher missed (asked each reconcile).
        Empty while a refresh holds the index, which reads what changed anyway."""
        if not self._lock.acquire(blocking=False):
            return []
        try:
            known = self._with_recovery(lambda: ftsdb.all_files(self._conn()), lambda: {})
            refill = self._refill
        except sqlite3.Error:  # not readable now (a full disk): every file counts as changed, so a refresh tries again
            refill = True
        finally:
            self._lock.release()
        current = self.sources.all()
        if refill:
            return [Path(path) for path in current]
        stale = [path for path, source in current.items()
                 if (record := known.get(path)) is None or record.source != source
                 or record.fingerprint != file_fingerprint(path)]
        return [Path(path) for path in [*stale, *(path for path in known if path not in current)]]

    def _embed_pending(self) -> int:
        """Embed units without a vector, a batch at a time, asking the model outside the lock (searches
        go on meanwhile); at most MAX_EMBED_PER_REFRESH per refresh, the rest at the next one."""
        done = 0
        while done < MAX_EMBED_PER_REFRESH:
            with self._lock:
                batch = self._with_recovery(lambda: self._vectors.pending(self._conn()), lambda: [])
            codes = self._vectors.codes_for(batch) if batch else None
            if codes is None:
                break
            with self._lock, ftsdb.transaction(self._conn()):
                self._vectors.store(self._conn(), batch, codes)
            done += len(batch)
        return done

    def rebuild(self) -> dict:
        """Forget everything and index the workspace from scratch."""
        with self._lock:
            self._reset()
            return self._with_recovery(lambda: self._refresh(None), lambda: self._refresh(None))

    def search(self, query: str, *, limit: int = 10, min_score: float = 0.0) -> list[SearchHit]:
        """The best *limit* hits for free text scoring at least *min_score* (0-1); any string is safe."""
        parsed = parse_query(query, now=self._clock())
        if not parsed.clauses or limit <= 0:
            return []
        limit = min(limit, MAX_LIMIT)
        wanted = max(limit * CANDIDATES_PER_HIT, MIN_CANDIDATES)

        def run(connection: sqlite3.Connection | None = None) -> list[tuple[ftsdb.MatchRow, float]]:
            connection = connection or self._conn()
            ranked = ranked_units(connection, parsed, self._selector, self._stemmer, self._units, wanted)
            if self._vectors is None or parsed.time_only:
                return ranked
            return with_vectors(connection, ranked, self._vectors.nearest(connection, query))

        def refill_and_run() -> list[tuple[ftsdb.MatchRow, float]]:
            self._refresh(None)
            return run()

        try:
            if self._lock.acquire(blocking=False):
                try:
                    rows = self._with_recovery(refill_and_run if self._refill else run, refill_and_run)
                finally:
                    self._lock.release()
            else:
                # A refresh holds the index (building a large one takes seconds): answer from what it has
                # committed so far, through a read-only connection of its own (WAL), instead of waiting.
                with self._reading:
                    rows = run(self._reader())
        except sqlite3.Error as exc:
            logger.warning("builtin search failed for {!r}: {}", query[:200], exc)
            return []
        return build_hits(rows, parsed.terms, limit, self.sources.display_path, min_score)

    def rescore(self, query: str, hits: list[SearchHit]) -> list[SearchHit]:
        """Hits of another backend scored as this index scores its own, so min_score means the same everywhere."""
        parsed = parse_query(query, now=self._clock())
        rows = [ftsdb.MatchRow(index, hit.path, hit.source, 0, 0, hit.when, hit.session_key, None,
                               body=hit.text or hit.snippet, score=0.0,
                               dates=unit_dates("", parse_timestamp(hit.when)))  # dated by its own day alone
                for index, hit in enumerate(hits)]
        if not parsed.clauses or not rows:
            return hits
        with self._lock:
            try:
                scored = score_rows(self._conn(), parsed, self._selector, self._stemmer, self._units, rows)
            except sqlite3.Error as exc:
                logger.warning("could not score hits for {!r}: {}", query[:200], exc)
                return hits
        by_position = {row.unit_id: round(score, 4) for row, score in scored}
        return [replace(hit, score=by_position.get(index, 0.0)) for index, hit in enumerate(hits)]

    def stats(self) -> dict:
        """Size and freshness of the index; never waits for a running refresh (status must stay instant)."""
        if not self._lock.acquire(blocking=False):
            return dict(self._last_stats, refreshing=True)
        try:
            units, files = self._with_recovery(lambda: ftsdb.counts(self._conn()), lambda: ftsdb.counts(self._conn()))
            last = ftsdb.get_meta(self._conn(), "last_refresh")
            vectors = self._conn().execute("SELECT count(*) FROM vectors").fetchone()[0] if self._vectors else 0
        finally:
            self._lock.release()
        size = 0
        for suffix in ("", "-wal"):
            try:
                size += os.stat(str(self.db_path) + suffix).st_size
            except FileNotFoundError:
                pass
        self._last_stats = {"units": units, "files": files, "last_refresh": last, "db_bytes": size}
        if self._vectors is not None:
            self._last_stats["embeddings"] = {"vectors": vectors, **self._vectors.status()}
        return dict(self._last_stats)

    def close(self) -> None:
        """Close the database connections (the index can be opened again later)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            with self._reading:
                if self._read_connection is not None:
                    self._read_connection.close()
                    self._read_connection = None

    # -- database lifecycle -----------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            connection = ftsdb.connect(self.db_path)
        except ftsdb.IndexCorrupt as exc:
            logger.warning("search index {} unusable ({}); rebuilding it", self.db_path, exc)
            ftsdb.delete_database(self.db_path)
            self._refill = True
            connection = ftsdb.connect(self.db_path)
        try:
            if ftsdb.get_meta(connection, "layout") != self._layout:
                # Units were cut another way (other window sizes, older code): start afresh.
                with ftsdb.transaction(connection):
                    ftsdb.clear(connection)
                    ftsdb.set_meta(connection, "layout", self._layout)
            self._units = ftsdb.counts(connection)[0]
        except sqlite3.Error:
            self._units = 0  # damage shows up, and is repaired, at the first real use
        return connection

    def _conn(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = self._open()
        return self._connection

    def _reader(self) -> sqlite3.Connection:
        """The read-only connection searches use while a refresh holds the index (under self._reading)."""
        if self._read_connection is None:
            self._read_connection = sqlite3.connect(self.db_path, check_same_thread=False)
            self._read_connection.execute("PRAGMA query_only = 1")
        return self._read_connection

    def _reset(self) -> None:
        self.close()
        ftsdb.delete_database(self.db_path)
        self._refill = True
        self._units = 0
        self._connection = self._open()

    def _with_recovery(self, operation: Callable, after_reset: Callable):
        """Run *operation*; if the database turns out to be damaged, start a new one and run *after_reset*."""
        try:
            return operation()
        except sqlite3.Error as exc:
            if not ftsdb.is_corruption(exc):
                raise
            logger.warning("search index {} damaged ({}); rebuilding it", self.db_path, exc)
        self._reset()
        return after_reset()

    # -- refresh ----------------------------------------------------------------------------------

    def _refresh(self, changed: list[Path] | None) -> dict:
        started = time.monotonic()
        totals = {"files_checked": 0, "files_reindexed": 0, "units_added": 0, "units_removed": 0}
        connection = self._conn()
        known = ftsdb.all_files(connection)
        if changed is None:
            targets = {path: (source, False) for path, source in self.sources.all().items()}
            stale = [record for path, record in known.items() if path not in targets]
        else:
            targets, stale = self._changed_targets(changed, known)
        for record in stale:
            with ftsdb.transaction(connection):
                totals["units_removed"] += ftsdb.delete_file(connection, record.file_id)
        for path, (source, forced) in targets.items():
            totals["files_checked"] += 1
            fingerprint = file_fingerprint(path)
            record = known.get(path)
            if fingerprint is None:
                if record is not None:
                    with ftsdb.transaction(connection):
                        totals["units_removed"] += ftsdb.delete_file(connection, record.file_id)
                continue
            if not forced and record is not None and record.fingerprint == fingerprint and record.source == source:
                continue
            added, removed = self._index_file(path, source, fingerprint)
            totals["files_reindexed"] += 1
            totals["units_added"] += added
            totals["units_removed"] += removed
        ftsdb.set_meta(connection, "last_refresh", iso_seconds(self._clock()))
        ftsdb.trim_wal(connection, self.db_path)
        self._units = max(0, self._units + totals["units_added"] - totals["units_removed"])
        if changed is None:
            self._refill = False
        if self._vectors is not None:
            self._vectors.changed()
        totals["seconds"] = round(time.monotonic() - started, 4)
        return totals

    def _changed_targets(self, changed: list[Path], known: dict) -> tuple[dict, list]:
        """Files named explicitly are re-read; a directory means its sources, checked by fingerprint."""
        targets: dict[str, tuple[str, bool]] = {}
        stale = []
        sources = None
        for raw in changed:
            path = Path(raw).expanduser()
            path = Path(os.path.abspath(path if path.is_absolute() else self.workspace / path))
            if self.sources.classify(path) is None and str(path) not in known:
                path = path.resolve()  # named through a symlinked folder; a symlinked file is covered by its name
            if path.is_dir():
                sources = self.sources.all() if sources is None else sources
                prefix = str(path) + os.sep
                for candidate, source in sources.items():
                    if candidate.startswith(prefix):
                        targets.setdefault(candidate, (source, False))
                stale += [record for name, record in known.items()
                          if name.startswith(prefix) and name not in sources]
                continue
            source = self.sources.classify(path)
            if source is not None:
                targets[str(path)] = (source, True)
            elif str(path) in known:
                stale.append(known[str(path)])
        return targets, stale

    def _index_file(self, path: str, source: str, fingerprint: str) -> tuple[int, int]:
        """Bring one file's units up to date in one transaction; return (added, removed)."""
        connection = self._conn()
        session_key = session_key_for(Path(path)) if source == "session" else None
        try:
            with ftsdb.transaction(connection):
                file_id = ftsdb.save_file(connection, path, source, fingerprint, session_key)
                stored = ftsdb.unit_keys(connection, file_id)
                current: set[str] = set()
                added = 0
                batch: list[Unit] = []
                for key, unit in self._scan(Path(path), source, session_key, set(stored)):
                    if unit is not None and key not in current:
                        batch.append(unit)
                    current.add(key)
                    if len(batch) >= INSERT_BATCH:
                        added += ftsdb.insert_units(connection, file_id, batch)
                        batch = []
                added += ftsdb.insert_units(connection, file_id, batch)
                gone = [unit_id for key, unit_id in stored.items() if key not in current]
                removed = ftsdb.delete_units(connection, gone)
        except sqlite3.Error:
            raise
        except Exception as exc:  # one unreadable file must not keep the others from being indexed
            logger.warning("could not index {}: {!r}", path, exc)
            return 0, 0
        return added, removed

    def _scan(self, path: Path, source: str, session_key: str | None,
              known: set[str]) -> Iterator[tuple[str, Unit | None]]:
        if source == "history":
            yield from history_units(path, known)
        elif source == "session":
            if not is_skipped_session(session_key):
                yield from session_units(path, session_key, known, window=self.window, stride=self.stride)
        else:
            for unit in self._markdown(path, source):
                yield unit.key, (None if unit.key in known else unit)

    def _markdown(self, path: Path, source: str) -> list[Unit]:
        text = read_text_lossy(path, limit=MAX_MARKDOWN_BYTES)
        day = note_date(path) if source == "note" else None
        if day is not None:
            return markdown_units(text, source, day.isoformat(), day)
        when = iso_seconds(datetime.fromtimestamp(path.stat().st_mtime))
        return markdown_units(text, source, when)
