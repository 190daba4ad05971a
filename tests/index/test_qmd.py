"""The QMD backend against the real qmd (when scripts/install-qmd.sh has run) and against broken stand-ins."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest

from nanobotd.config.schema import QmdSettings
from nanobotd.index.hit import SearchBackendError
from nanobotd.index.qmd import COLLECTION_MASK, QmdBackend, collection_name
from tests.support.observe import stat_fields

REPO_ROOT = Path(__file__).resolve().parents[2]
QMD_BINARY = REPO_ROOT / ".qmd-prefix" / "bin" / "qmd"
needs_qmd = pytest.mark.skipif(
    not os.access(QMD_BINARY, os.X_OK), reason=f"qmd not installed at {QMD_BINARY}: run scripts/install-qmd.sh"
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "memory" / "archive").mkdir(parents=True)
    (root / "SOUL.md").write_text("# Soul\n\n## Tone\n\nCalm and exact.\n")
    (root / "USER.md").write_text("# User\n\n## Preferences\n\nDrinks green tea.\n")
    (root / "memory" / "MEMORY.md").write_text("# Memory\n\n## Projects\n\nThe kumquat project ships in May.\n")
    (root / "memory" / "2026-01-02.md").write_text("# 2026-01-02\n\n## Notes\n\nTalked about the pangolin.\n")
    (root / "memory" / "archive" / "2025-10-01.md").write_text("# 2025-10-01\n\n## Old\n\nWalrus census.\n")
    (root / "memory" / "history.jsonl").write_text('{"text": "zeppelin in history"}\n')
    (root / "README.md").write_text("zeppelin outside memory\n")
    return root


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    # With CI=true qmd refuses LLM work in searches instead of fetching models; HOME is a scratch folder.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"), "CI": "true"}


def make_backend(workspace: Path, tmp_path: Path, environ: dict, **settings) -> QmdBackend:
    settings.setdefault("command", str(QMD_BINARY))
    return QmdBackend(workspace, tmp_path / "state", QmdSettings(**settings), environ=environ)


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


async def wait_until_indexed(*backends: QmdBackend, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [backend.freshness() for backend in backends]
        if all(state["pending_changes"] == 0 and not state["updating"] for state in states):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"still not indexed: {[backend.freshness() for backend in backends]}")


def process_is_gone(pid: int, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            # A killed orphan can stay a zombie until the container's init reaps it: it is dead.
            if stat_fields(pid)[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def fake_qmd(
    tmp_path: Path, workspace: Path, *, version: str = "", update: str = "", search: str = "", vector: str = ""
) -> Path:
    """A stand-in qmd: answers --version and `collection show` like qmd 2.8, runs the given shell per command."""
    script = tmp_path / "fake-qmd"
    version = version or "echo 'qmd 2.8.3 (fake)'"
    show = f"printf '  Path:     %s\\n  Pattern:  %s\\n' '{os.path.realpath(workspace)}' '{COLLECTION_MASK}'"
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        '  case "$arg" in\n'
        f"    --version) {version}; exit 0 ;;\n"
        f"    show) {show}; exit 0 ;;\n"
        f"    update) {update or 'true'}; exit 0 ;;\n"
        f"    search) {search or 'echo []'}; exit 0 ;;\n"
        f"    vsearch|query) {vector or 'echo []'}; exit 0 ;;\n"
        "  esac\n"
        "done\n"
    )
    script.chmod(0o755)
    return script


def hang_with_child(pid_file: Path) -> str:
    return f"sleep 1000 & echo $! > '{pid_file}'; wait"


@needs_qmd
def test_fact_written_to_memory_is_found_after_update_now(workspace, tmp_path, environ):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, mcp_server=False)
        await backend.start()
        try:
            assert backend.available, backend.freshness()["reason"]
            assert await backend.search("quokka") == []
            append(workspace / "memory" / "MEMORY.md", "\n## Tools\n\nEdits text in the quokka editor.\n")
            (workspace / "memory" / "2026-01-03.md").write_text("# 2026-01-03\n\n## Notes\n\nAdopted a quokka.\n")
            await backend.update_now()
            hits = await backend.search("quokka")
            zeppelin_hits = await backend.search("zeppelin")
        finally:
            await backend.close()
        by_path = {hit.path: hit for hit in hits}
        assert set(by_path) == {"memory/MEMORY.md", "memory/2026-01-03.md"}
        memory_hit = by_path["memory/MEMORY.md"]
        assert (memory_hit.source, memory_hit.backend) == ("memory", "qmd")
        assert "quokka editor" in memory_hit.snippet
        lines = (workspace / "memory" / "MEMORY.md").read_text().splitlines()
        assert memory_hit.line_start <= lines.index("Edits text in the quokka editor.") + 1 <= memory_hit.line_end
        note_hit = by_path["memory/2026-01-03.md"]
        assert (note_hit.source, note_hit.when) == ("note", "2026-01-03")
        assert zeppelin_hits == []  # history.jsonl and files outside memory are not in the collection

    asyncio.run(scenario())


@needs_qmd
def test_deleted_section_disappears_after_update(workspace, tmp_path, environ):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, mcp_server=False)
        await backend.start()
        try:
            assert [hit.path for hit in await backend.search("walrus")] == ["memory/archive/2025-10-01.md"]
            archived = workspace / "memory" / "archive" / "2025-10-01.md"
            archived.write_text("# 2025-10-01\n")
            memory = workspace / "memory" / "MEMORY.md"
            memory.write_text(memory.read_text().replace("## Projects\n\nThe kumquat project ships in May.\n", ""))
            await backend.update_now()
            assert await backend.search("walrus") == []
            assert await backend.search("kumquat") == []
        finally:
            await backend.close()

    asyncio.run(scenario())


@needs_qmd
def test_update_recreates_a_collection_whose_state_was_wiped(workspace, tmp_path, environ):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, mcp_server=False)
        await backend.start()
        try:
            shutil.rmtree(backend.home)
            await backend.update_now()
            return await backend.search("pangolin"), backend.freshness()
        finally:
            await backend.close()

    hits, freshness = asyncio.run(scenario())
    assert [hit.path for hit in hits] == ["memory/2026-01-02.md"]
    assert freshness["documents"] == 5


@needs_qmd
def test_concurrent_update_bursts_never_overlap_and_end_indexed(workspace, tmp_path, environ):
    run_log = tmp_path / "update-runs.log"
    logging_qmd = tmp_path / "logging-qmd"
    logging_qmd.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" update "*)\n'
        f'  echo "start $$ $(date +%s.%N)" >> {run_log}\n'
        f'  "{QMD_BINARY}" "$@"; status=$?\n'
        f'  echo "end $$ $(date +%s.%N)" >> {run_log}\n'
        "  exit $status ;;\n"
        "esac\n"
        f'exec "{QMD_BINARY}" "$@"\n'
    )
    logging_qmd.chmod(0o755)

    async def burst(backend: QmdBackend, label: str) -> None:
        for number in range(6):
            append(workspace / "memory" / "MEMORY.md", f"\n## {label} {number}\n\nFact {label}fact{number}.\n")
            backend.request_update()
            await asyncio.sleep(0.05)

    async def scenario():
        settings = {"command": str(logging_qmd), "debounce_seconds": 0.2, "mcp_server": False}
        first = make_backend(workspace, tmp_path, environ, **settings)
        second = make_backend(workspace, tmp_path, environ, **settings)
        await first.start()
        await second.start()
        try:
            await asyncio.gather(burst(first, "alpha"), burst(second, "beta"))
            await wait_until_indexed(first, second)
            hits = {label: await first.search(f"{label}fact5") for label in ("alpha", "beta")}
            return first.freshness()["update_runs"] + second.freshness()["update_runs"], hits
        finally:
            await first.close()
            await second.close()

    runs, hits = asyncio.run(scenario())
    events = [line.split() for line in run_log.read_text().splitlines()]
    events.sort(key=lambda event: float(event[2]))
    kinds = [event[0] for event in events]
    assert kinds == ["start", "end"] * (len(events) // 2), f"overlapping qmd update runs: {events}"
    assert all(events[i][1] == events[i + 1][1] for i in range(0, len(events), 2))
    # Each backend: one start-up catch-up run, one run per burst and at most one follow-up.
    assert 2 <= runs == len(events) // 2 <= 6
    assert all(result and result[0].path == "memory/MEMORY.md" for result in hits.values()), hits


@needs_qmd
def test_freshness_counts_documents_pending_changes_and_embeddings(workspace, tmp_path, environ):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, debounce_seconds=60.0, mcp_server=False)
        await backend.start()
        try:
            started = backend.freshness()
            append(workspace / "memory" / "MEMORY.md", "\nNew line.\n")
            (workspace / "memory" / "2026-01-04.md").write_text("# 2026-01-04\n\nAnother day.\n")
            backend.request_update()
            backend.request_update()
            requested = backend.freshness()
            await backend.update_now()
            return started, requested, backend.freshness()
        finally:
            await backend.close()

    started, requested, updated = asyncio.run(scenario())
    assert started["available"] and started["reason"] is None and started["last_error"] is None
    assert (started["documents"], started["needs_embedding"], started["pending_changes"]) == (5, 5, 0)
    assert started["version"].startswith("2.")
    assert (requested["pending_changes"], requested["documents"]) == (2, 5)
    assert (updated["pending_changes"], updated["documents"], updated["needs_embedding"]) == (0, 6, 6)
    assert updated["updating"] is False and updated["update_runs"] == 1
    assert datetime.fromisoformat(updated["last_update"]) >= datetime.fromisoformat(started["last_update"])


@needs_qmd
def test_vector_modes_degrade_to_bm25_with_a_reason_in_bounded_time(workspace, tmp_path, environ):
    async def scenario():
        results = {}
        off = make_backend(workspace, tmp_path, environ, mcp_server=False)
        # A long debounce: its start-up update would be followed by `qmd embed`, which needs a model.
        on = make_backend(
            workspace, tmp_path, environ, mcp_server=False, vectors=True, timeout_seconds=3.0, debounce_seconds=600.0
        )
        await off.start()
        await on.start()
        try:
            for label, backend, mode in [("off", off, "vsearch"), ("empty", on, "vsearch"), ("query", on, "query"),
                                         ("query again", on, "query")]:
                began = time.monotonic()
                hits = await backend.search("kumquat", mode=mode)
                results[label] = (hits, time.monotonic() - began)
            return results, on.freshness()
        finally:
            await off.close()
            await on.close()

    results, freshness = asyncio.run(scenario())
    for label, (hits, elapsed) in results.items():
        assert [hit.path for hit in hits] == ["memory/MEMORY.md"], label
        assert hits[0].extra["degraded"].endswith("answered with BM25"), label
        assert elapsed < 3.0 + 4.0, (label, elapsed)  # the call timeout plus a BM25 search
    assert "qmd_vectors = false" in results["off"][0][0].extra["degraded"]
    assert "no embeddings" in results["empty"][0][0].extra["degraded"]
    assert "qmd query" in results["query"][0][0].extra["degraded"]
    # A failed vector mode is remembered rather than retried (and waited for) on every search.
    assert results["query again"][0][0].extra["degraded"] == results["query"][0][0].extra["degraded"]
    assert freshness["vectors"].startswith("failing: qmd query")


@needs_qmd
def test_mcp_server_answers_searches_and_dies_with_close(workspace, tmp_path, environ):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ)
        await backend.start()
        try:
            first = await backend.search("pangolin")  # answered by the CLI while the server starts
            assert await backend._mcp.wait_ready()
            pid = backend._mcp._process.pid
            append(workspace / "memory" / "2026-01-02.md", "\nSaw a narwhal.\n")
            await backend.update_now()
            served = await backend.search("narwhal")
        finally:
            await backend.close()
        return first, served, pid

    first, served, pid = asyncio.run(scenario())
    assert [(hit.path, hit.extra["transport"]) for hit in first] == [("memory/2026-01-02.md", "cli")]
    assert [(hit.path, hit.extra["transport"]) for hit in served] == [("memory/2026-01-02.md", "mcp")]
    assert "narwhal" in served[0].snippet and not served[0].snippet[0].isdigit()
    assert process_is_gone(pid)


def test_missing_binary_makes_backend_unavailable_and_search_raise(workspace, tmp_path, environ):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, command="qmd-that-is-not-installed")
        await backend.start()
        try:
            with pytest.raises(SearchBackendError, match="not found"):
                await backend.search("kumquat")
            with pytest.raises(SearchBackendError):
                await backend.update_now()
            backend.request_update()
            return backend.available, backend.freshness()
        finally:
            await backend.close()

    available, freshness = asyncio.run(scenario())
    assert available is False
    assert "qmd-that-is-not-installed" in freshness["reason"]
    assert freshness["documents"] is None


@pytest.mark.parametrize(
    "broken",
    [
        {"version": "echo 'segmentation fault' >&2; exit 1"},
        {"version": "echo 'hello there'"},
        {"search": "echo 'Error: database is corrupt' >&2; exit 1"},
        {"search": "echo '{not json'"},
        {"search": "echo '[{\"file\": 3'"},
    ],
    ids=["version-fails", "version-garbage", "search-fails", "search-garbage", "search-truncated"],
)
def test_broken_binary_raises_search_backend_error(workspace, tmp_path, environ, broken):
    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, command=str(fake_qmd(tmp_path, workspace, **broken)))
        await backend.start()
        try:
            with pytest.raises(SearchBackendError):
                await backend.search("kumquat")
            return backend.available
        finally:
            await backend.close()

    assert asyncio.run(scenario()) is ("version" not in broken)


def test_hanging_binary_is_killed_with_its_process_group_within_timeout(workspace, tmp_path, environ):
    version_pid, search_pid = tmp_path / "version-child.pid", tmp_path / "search-child.pid"

    async def scenario():
        hangs_at_start = make_backend(
            workspace, tmp_path, environ, timeout_seconds=1.0, start_timeout_seconds=1.0,
            command=str(fake_qmd(tmp_path / "a", workspace, version=hang_with_child(version_pid))),
        )
        hangs_in_search = make_backend(
            workspace, tmp_path, environ, timeout_seconds=1.0, mcp_server=False,
            command=str(fake_qmd(tmp_path / "b", workspace, search=hang_with_child(search_pid))),
        )
        began = time.monotonic()
        await hangs_at_start.start()
        start_elapsed = time.monotonic() - began
        await hangs_in_search.start()
        began = time.monotonic()
        with pytest.raises(SearchBackendError, match="timed out"):
            await hangs_in_search.search("kumquat")
        search_elapsed = time.monotonic() - began
        available = hangs_at_start.available
        await hangs_at_start.close()
        await hangs_in_search.close()
        return available, start_elapsed, search_elapsed

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    available, start_elapsed, search_elapsed = asyncio.run(scenario())
    assert available is False
    assert start_elapsed < 3.0 and search_elapsed < 3.0
    assert process_is_gone(int(version_pid.read_text()))
    assert process_is_gone(int(search_pid.read_text()))


def test_requests_during_a_run_cause_exactly_one_follow_up_run(workspace, tmp_path, environ):
    run_log = tmp_path / "runs.log"
    script = fake_qmd(tmp_path, workspace, update=f"echo run >> '{run_log}'; sleep 0.5")

    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, command=str(script), debounce_seconds=0.1)
        await backend.start()  # the collection already exists, so start asks for one catch-up update
        try:
            await asyncio.sleep(0.3)  # that run is now in progress
            assert backend.freshness()["updating"]
            for _ in range(5):
                backend.request_update()
                await asyncio.sleep(0.02)
            await wait_until_indexed(backend, timeout=10.0)
            return backend.freshness()
        finally:
            await backend.close()

    freshness = asyncio.run(scenario())
    assert run_log.read_text().splitlines() == ["run", "run"]
    assert (freshness["update_runs"], freshness["pending_changes"]) == (2, 0)


def test_hanging_vector_search_degrades_to_bm25_within_the_timeout(workspace, tmp_path, environ):
    name = collection_name(Path(os.path.realpath(workspace)))
    canned = (
        f'[{{"docid": "#1a2b3c", "score": 0.61, "file": "qmd://{name}/memory/MEMORY.md?index={name}", "line": 5,'
        ' "title": "Memory", "snippet": "@@ -4,2 @@ (3 before, 0 after)\\nThe kumquat project ships in May.\\n"}]'
    )
    child_pid = tmp_path / "vector-child.pid"
    script = fake_qmd(tmp_path, workspace, search=f"printf '%s\\n' '{canned}'", vector=hang_with_child(child_pid))

    async def scenario():
        backend = make_backend(
            workspace, tmp_path, environ, command=str(script), vectors=True, timeout_seconds=1.0, mcp_server=False
        )
        await backend.start()
        try:
            began = time.monotonic()
            hits = await backend.search("kumquat", mode="vsearch")
            return hits, time.monotonic() - began
        finally:
            await backend.close()

    hits, elapsed = asyncio.run(scenario())
    assert elapsed < 3.0
    assert process_is_gone(int(child_pid.read_text()))
    [hit] = hits
    assert (hit.path, hit.source, hit.score) == ("memory/MEMORY.md", "memory", 0.61)
    assert (hit.line_start, hit.line_end) == (4, 5)
    assert hit.snippet == "The kumquat project ships in May."
    assert "timed out" in hit.extra["degraded"] and hit.extra["degraded"].endswith("answered with BM25")


def test_a_question_becomes_one_lex_search_of_its_words_and_one_per_word():
    from nanobotd.index.qmdoutput import lexical_searches

    assert lexical_searches("What did Caroline research about adoption?") == [
        {"type": "lex", "query": "caroline research adoption"}, {"type": "lex", "query": "caroline"},
        {"type": "lex", "query": "research"}, {"type": "lex", "query": "adoption"}]
    assert lexical_searches("kumquat") == [{"type": "lex", "query": "kumquat"}]


def test_a_cancelled_search_kills_the_qmd_child_with_its_process_group(workspace, tmp_path, environ):
    child_pid = tmp_path / "search-child.pid"
    script = fake_qmd(tmp_path, workspace, search=hang_with_child(child_pid))

    async def scenario():
        backend = make_backend(workspace, tmp_path, environ, command=str(script), timeout_seconds=600.0,
                               mcp_server=False)
        await backend.start()
        try:
            searching = asyncio.ensure_future(backend.search("kumquat"))
            while not child_pid.exists() or not child_pid.read_text().strip():
                await asyncio.sleep(0.02)
            searching.cancel()
            began = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await searching
            return time.monotonic() - began
        finally:
            await backend.close()

    assert asyncio.run(scenario()) < 1.0
    assert process_is_gone(int(child_pid.read_text()))
