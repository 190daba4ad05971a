"""The QMD search backend: one QMD collection per workspace, kept fresh by debounced single-flight updates.

QMD_CONFIG_DIR and XDG_CACHE_HOME point into `<state_dir>/qmd/` (`config/`, `cache/qmd/` with index and models,
`<name>.update.lock`), so nothing lands in the workspace or home; every call passes `--index <name>` and runs from
there, so no `.qmd/` folder above a working directory can redirect the index. A second collection holds history and
transcripts exported as markdown (index.qmdexport), synced before every `qmd update`. BM25 goes to a long-lived
`qmd mcp --http` child when it is up, else to the CLI, bounded by search.qmd_timeout_seconds. Vector modes need local
models that may be missing or broken: then BM25 answers, each hit saying why in extra["degraded"], and one failure
rests them for VECTOR_RETRY_SECONDS."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from loguru import logger

from nanobotd.config.schema import QmdSettings
from nanobotd.index.hit import SearchBackendError, SearchHit
from nanobotd.index.qmdexport import QmdExport
from nanobotd.index.qmdoutput import (
    QmdResult,
    collection_fields,
    hits_from_results,
    iso_time,
    json_array,
    lexical_searches,
    normalize_query,
    read_index_stats,
)
from nanobotd.index.qmdproc import (
    McpServer,
    QmdTimeout,
    check_version,
    child_environment,
    index_lock,
    resolve_command,
    run_qmd,
)
from nanobotd.index.query import parse_query

COLLECTION_PREFIX = "nb-"
# QMD takes a comma-separated list of globs; memory/*.md covers MEMORY.md and the daily notes, and
# leaves out memory/history.jsonl and anything that is not markdown.
COLLECTION_MASK = "SOUL.md,USER.md,memory/*.md,memory/archive/*.md"
# History entries and session transcripts, exported as markdown into the state dir (index.qmdexport).
EXPORT_SUFFIX = "-x"
EXPORT_MASK = "history/*.md,sessions/*/*.md"
SEARCH_MODES = ("search", "vsearch", "query")
UPDATE_TIMEOUT_SECONDS = 120.0
UPDATE_RETRY_SECONDS = 30.0
EMBED_TIMEOUT_SECONDS = 900.0
DEBOUNCE_MAX_FACTOR = 5
VECTOR_RETRY_SECONDS = 1800.0


def collection_name(workspace: Path) -> str:
    """The QMD collection (and index) name of *workspace*: stable, short, safe as a file name."""
    return COLLECTION_PREFIX + hashlib.sha1(str(workspace).encode("utf-8")).hexdigest()[:12]


class QmdBackend:
    """Searches one workspace's memory files with QMD and keeps its index fresh."""

    def __init__(self, workspace: Path, state_dir: Path, settings: QmdSettings, *,
                 clock: Callable[[], float] = time.time, environ: Mapping[str, str] | None = None,
                 export: QmdExport | None = None) -> None:
        self.workspace = Path(os.path.realpath(workspace))
        self.settings = settings
        self.name = collection_name(self.workspace)
        self.export = export
        self.export_name = self.name + EXPORT_SUFFIX
        self.home = Path(state_dir) / "qmd"
        self.index_path = self.home / "cache" / "qmd" / f"{self.name}.sqlite"
        self.config_path = self.home / "config" / f"{self.name}.yml"
        self._clock = clock
        # The daemon hands its configured environment down; without one, children get the process's own.
        self._env = child_environment(self.home, os.environ if environ is None else environ)
        self._lock_path = self.home / f"{self.name}.update.lock"
        self._update_timeout = max(settings.timeout_seconds, UPDATE_TIMEOUT_SECONDS)
        self._start_timeout = settings.start_timeout_seconds
        self._executable: str | None = None
        self._version: str | None = None
        self.available = False  # once start() found a working qmd and the workspace collection
        self._reason: str | None = "not started"
        self._last_error: str | None = None
        self._last_update: float | None = None
        self._update_runs = 0
        self._updating = False
        self._requests_seen = 0
        self._requests_indexed = 0
        self._update_mutex = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._burst_started_at: float | None = None
        self._worker: asyncio.Task | None = None
        self._embedder: asyncio.Task | None = None
        self._vector_failure: str | None = None
        self._vectors_retry_at = 0.0
        self._mcp: McpServer | None = None
        self._closed = False

    async def start(self) -> None:
        """Check the qmd binary and ensure the workspace collection; on failure record why, never raise."""
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            self._executable = resolve_command(self.settings.command, self._env)
            self._version = await check_version(self._executable, env=self._env, cwd=self.home,
                                                timeout=self._start_timeout)
            created = await self._ensure_collection()
        except (SearchBackendError, OSError) as exc:
            self.available, self._reason = False, str(exc)
            logger.warning("qmd backend unavailable for {}: {}", self.workspace, exc)
            return
        self.available, self._reason = True, None
        base_argv = [self._executable, "--index", self.name]
        self._mcp = McpServer(base_argv, env=self._env, cwd=self.home, clock=self._clock)
        logger.info("qmd {} serves {} as collection {}", self._version, self.workspace, self.name)
        if not created:
            self.request_update()  # files may have changed while nobody watched

    def request_update(self) -> None:
        """Note that memory files changed: one debounced, single-flight update will pick it up."""
        self._requests_seen += 1
        if self.available and not self._closed:
            self._arm_timer(self.settings.debounce_seconds)

    async def update_now(self) -> None:
        """Run one `qmd update` under the index lock; raise SearchBackendError when it fails."""
        self._require_available()
        if not self.config_path.exists():
            # Someone cleared the state dir under us: without its config qmd would update nothing, and a
            # running server would keep reading the deleted index.
            await self._ensure_collection()
            await self._mcp.stop()  # set by start() with available, which _require_available() checked
        async with index_lock(self._update_mutex, self._lock_path, self._update_timeout):
            requests_covered = self._requests_seen
            self._updating = True
            try:
                if self.export is not None:
                    await self._sync_export()
                result = await self._qmd("update", timeout=self._update_timeout, check=True)
            except SearchBackendError as exc:
                self._last_error = str(exc)
                raise
            finally:
                self._updating = False
        self._requests_indexed = max(self._requests_indexed, requests_covered)
        self._last_update = self._clock()
        self._last_error = None
        self._update_runs += 1
        summary = next((line for line in result.stdout.splitlines() if line.startswith("Indexed:")), "")
        logger.debug("qmd update of {}: {}", self.name, summary.strip() or "done")
        if self.settings.vectors:
            self._start_embedding()

    async def search(self, query: str, *, limit: int = 10, mode: str = "search") -> list[SearchHit]:
        """Ranked hits for *query*; vector modes degrade to BM25 with the reason in extra["degraded"]."""
        if mode not in SEARCH_MODES:
            raise ValueError(f"unknown qmd search mode {mode!r}; expected one of {', '.join(SEARCH_MODES)}")
        self._require_available()
        query = normalize_query(query)
        if not query:
            return []
        degraded = None
        if mode != "search":
            degraded = self._vectors_unavailable(mode)
            if degraded is None:
                try:
                    return await self._cli_search(mode, query, limit)
                except SearchBackendError as exc:
                    degraded = self._vectors_failed(str(exc))
        try:  # BM25, from the server or else the CLI, within one timeout in all (an agent is waiting)
            hits = await asyncio.wait_for(self._lexical_search(query, limit), self.settings.timeout_seconds)
        except TimeoutError:
            raise QmdTimeout(f"qmd search timed out after {self.settings.timeout_seconds:g}s") from None
        if degraded is not None:
            hits = [dataclasses.replace(hit, extra={**hit.extra, "degraded": degraded}) for hit in hits]
        return hits

    async def warm_up(self) -> None:
        """Start the BM25 server and wait until it answers, so the first searches do not pay for it."""
        if self.available and self.settings.mcp_server and self._mcp is not None:
            await self._mcp.wait_ready()

    def freshness(self) -> dict:
        """How current the index is, for the control API and the daemon's health tick."""
        stats = read_index_stats(self.index_path, self.name)
        last_update = iso_time(self._last_update) if self._last_update is not None else stats.last_write
        return {
            "available": self.available,
            "reason": self._reason,
            "last_update": last_update,
            "pending_changes": self._requests_seen - self._requests_indexed,
            "updating": self._updating,
            "documents": stats.documents,
            "needs_embedding": stats.needs_embedding,
            "last_error": self._last_error,
            "version": self._version,
            "update_runs": self._update_runs,
            "vectors": ("off" if not self.settings.vectors else f"failing: {self._vector_failure}"
                        if self._vectors_resting() else "on"),
            "mcp_server": bool(self._mcp and self._mcp.ready),
        }

    async def close(self) -> None:
        """Cancel pending work and stop every qmd child (process-group kill)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in (self._worker, self._embedder):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._mcp is not None:
            await self._mcp.close()

    # -- start -------------------------------------------------------------------------------------

    async def _ensure_collection(self) -> bool:
        """Make the collections match the workspace (and the export); True when one was (re)created."""
        if not self.workspace.is_dir():
            raise SearchBackendError(f"workspace {self.workspace} is not a directory")
        wanted = [(self.name, self.workspace, COLLECTION_MASK)]
        if self.export is not None:
            self.export.export_dir.mkdir(parents=True, exist_ok=True)
            wanted.append((self.export_name, self.export.export_dir.resolve(), EXPORT_MASK))
        created = False
        # Under the lock: another process may be creating the same collection right now.
        async with index_lock(self._update_mutex, self._lock_path, self._update_timeout):
            for name, folder, mask in wanted:
                show = await self._qmd("collection", "show", name, timeout=self._start_timeout)
                fields = collection_fields(show.stdout) if show.returncode == 0 else {}
                if fields.get("Path") == str(folder) and fields.get("Pattern") == mask:
                    continue
                if fields:
                    await self._qmd("collection", "remove", name, timeout=self._update_timeout, check=True)
                await self._qmd("collection", "add", str(folder), "--name", name, "--mask", mask,
                                timeout=self._update_timeout, check=True)
                created = True
        if created:
            self._last_update = self._clock()
        return created

    async def _sync_export(self) -> None:
        try:
            report = await asyncio.to_thread(self.export.sync)
        except OSError as exc:
            raise SearchBackendError(f"cannot export history and sessions for qmd: {exc}") from exc
        logger.debug("qmd export of {}: {}", self.name, report)

    # -- updates -----------------------------------------------------------------------------------

    def _arm_timer(self, delay: float) -> None:
        # Trailing debounce, capped so a steady stream of writes still gets indexed.
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._burst_started_at is None:
            self._burst_started_at = now
        fire_at = min(now + delay, self._burst_started_at + delay * DEBOUNCE_MAX_FACTOR)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(fire_at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._burst_started_at = None, None
        if self._closed:
            return
        # Single flight: a running worker notices the new requests when its run ends.
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._drain_updates())

    async def _drain_updates(self) -> None:
        while self.available and not self._closed and self._requests_seen > self._requests_indexed:
            try:
                await self.update_now()
            except SearchBackendError as exc:
                logger.warning("qmd update of {} failed, retrying in {:g}s: {}", self.name, UPDATE_RETRY_SECONDS, exc)
                if self._timer is None and not self._closed:
                    self._timer = asyncio.get_running_loop().call_later(UPDATE_RETRY_SECONDS, self._on_timer)
                return

    def _start_embedding(self) -> None:
        # Embedding runs beside updates, not under the index lock: it can take minutes (a model
        # download, a large workspace), and BM25 freshness must not wait for it.
        if self._vectors_resting() or (self._embedder is not None and not self._embedder.done()):
            return
        if not read_index_stats(self.index_path, self.name).needs_embedding:
            return
        self._embedder = asyncio.ensure_future(self._embed())

    async def _embed(self) -> None:
        try:
            result = await self._qmd("embed", timeout=EMBED_TIMEOUT_SECONDS)
        except SearchBackendError as exc:
            self._vectors_failed(f"qmd embed failed: {exc}")
            return
        # `qmd embed` exits 0 when it skipped work (no model, say): trust the counts, not the status.
        pending = read_index_stats(self.index_path, self.name).needs_embedding
        if result.returncode != 0 or pending:
            self._vectors_failed(f"qmd embed left {pending} documents without vectors: {result.error_text()}")

    # -- vectors -----------------------------------------------------------------------------------

    def _vectors_resting(self) -> bool:
        """True while a recent failure rests the vector modes."""
        return self._vector_failure is not None and self._clock() < self._vectors_retry_at

    def _vectors_unavailable(self, mode: str) -> str | None:
        """Why *mode* must be answered with BM25 now, or None when it may run."""
        if not self.settings.vectors:
            return f"{mode} needs vectors, which are off (search.qmd_vectors = false); answered with BM25"
        if self._vectors_resting():
            return f"{self._vector_failure}; answered with BM25"
        stats = read_index_stats(self.index_path, self.name)
        if mode == "vsearch" and stats.documents and stats.needs_embedding == stats.documents:
            return "the index has no embeddings yet; answered with BM25"
        return None

    def _vectors_failed(self, reason: str) -> str:
        """Rest the vector modes for a while; returns the reason to attach to the BM25 hits."""
        self._vector_failure, self._vectors_retry_at = reason, self._clock() + VECTOR_RETRY_SECONDS
        logger.warning("qmd vectors unusable for {:g}s: {}", VECTOR_RETRY_SECONDS, reason)
        return f"{reason}; answered with BM25"

    # -- search ------------------------------------------------------------------------------------

    async def _lexical_search(self, query: str, limit: int) -> list[SearchHit]:
        if self.settings.mcp_server and self._mcp is not None:
            self._mcp.ensure_started()
            if self._mcp.ready:
                payload = {"searches": lexical_searches(query), "collections": self._collections(), "limit": limit,
                           "rerank": False}
                try:
                    answer = await self._mcp.post("/search", payload, timeout=self.settings.timeout_seconds)
                    return self._hits(answer.get("results", []), mode="search", transport="mcp")
                except SearchBackendError as exc:
                    logger.debug("qmd mcp search failed, using the CLI: {}", exc)
        return await self._cli_search("search", " ".join(parse_query(query).terms) or query, limit)

    async def _cli_search(self, mode: str, query: str, limit: int) -> list[SearchHit]:
        try:
            collections = [word for name in self._collections() for word in ("-c", name)]
            result = await self._qmd(mode, "--format", "json", "-n", str(limit), *collections, "--", query,
                                     timeout=self.settings.timeout_seconds, check=True)
            return self._hits(json_array(result.stdout), mode=mode, transport="cli")
        except SearchBackendError as exc:
            self._last_error = str(exc)
            raise

    def _hits(self, items: list, *, mode: str, transport: str) -> list[SearchHit]:
        export = (self.export_name, self.export) if self.export is not None else None
        return hits_from_results(items, self.name, export, self.workspace, mode=mode, transport=transport)

    def _collections(self) -> list[str]:
        return [self.name] + ([self.export_name] if self.export is not None else [])

    # -- plumbing ----------------------------------------------------------------------------------

    def _require_available(self) -> None:
        if not self.available:
            raise SearchBackendError(f"qmd backend unavailable: {self._reason}")

    async def _qmd(self, *args: str, timeout: float, check: bool = False) -> QmdResult:
        argv = [self._executable, "--index", self.name, *args]
        return await run_qmd(argv, env=self._env, cwd=self.home, timeout=timeout, check=check)
