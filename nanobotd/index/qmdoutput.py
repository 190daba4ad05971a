"""What qmd prints and stores, read back: JSON search results, `collection show`, and its SQLite index.

QMD's formats are not a stable API (`qmd status` and `collection show` have no machine-readable
output), so every parse of them lives here, where a new qmd version needs looking at.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

from loguru import logger

from nanobotd.index.hit import SearchBackendError, SearchHit

MEMORY_FILES = frozenset({"SOUL.md", "USER.md", "memory/MEMORY.md"})
HUNK_PATTERN = re.compile(r"^@@ -(\d+),(\d+) @@")
HTTP_LINE_NUMBER = re.compile(r"^\d+: ?")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NOTE_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})\.md$")


@dataclass(frozen=True)
class IndexStats:
    """Counts read straight from QMD's SQLite index (`qmd status` has no machine-readable output)."""

    documents: int | None = None
    needs_embedding: int | None = None
    last_write: str | None = None


def hit_from_result(item: dict, collection: str, *, mode: str, transport: str) -> SearchHit | None:
    """A SearchHit from one QMD JSON result, or None when it is not a file of *collection*."""
    if not isinstance(item, dict):
        raise SearchBackendError(f"qmd {mode} result is not an object: {item!r:.200}")
    prefix = f"qmd://{collection}/"
    location = str(item.get("file", "")).split("?", 1)[0]
    if not location.startswith(prefix):
        return None
    path = unquote(location[len(prefix):])
    snippet, line_start, line_end = parse_snippet(
        str(item.get("snippet", "")), item.get("line"), numbered=transport == "mcp"
    )
    source = "memory" if path in MEMORY_FILES else "note"
    date = NOTE_DATE.search(path) if source == "note" else None
    try:
        score = float(item.get("score", 0.0))
    except (TypeError, ValueError):
        score = 0.0
    return SearchHit(
        source=source,
        path=path,
        snippet=snippet,
        score=score,
        when=date.group(1) if date else "",
        line_start=line_start,
        line_end=line_end,
        backend="qmd",
        extra={
            "docid": item.get("docid", ""),
            "title": item.get("title", ""),
            "mode": mode,
            "transport": transport,
        },
    )


def parse_snippet(snippet: str, line: object, *, numbered: bool) -> tuple[str, int | None, int | None]:
    """Split QMD's `@@ -start,count @@` header off a snippet; the header gives the line range.

    The HTTP server also prefixes every snippet line with a number of its own, which is dropped.
    """
    lines = ANSI_ESCAPE.sub("", snippet).split("\n")
    if numbered:
        lines = [HTTP_LINE_NUMBER.sub("", text, count=1) for text in lines]
    line_start = line_end = line if isinstance(line, int) and line > 0 else None
    if lines and (header := HUNK_PATTERN.match(lines[0])):
        start, count = int(header.group(1)), int(header.group(2))
        line_start, line_end = start, start + max(count, 1) - 1
        lines = lines[1:]
    return "\n".join(lines).strip("\n"), line_start, line_end


def read_index_stats(index_path: Path, collection: str) -> IndexStats:
    """Document and pending-embedding counts of *collection*, read-only; empty stats when unreadable.

    Pending embeddings count distinct content hashes without a complete set of vectors, as `qmd status`
    does, though for any embedding model rather than only the configured one.
    """
    try:
        files = (index_path, Path(f"{index_path}-wal"))
        write_times = [path.stat().st_mtime for path in files if path.exists()]
        if not write_times:
            return IndexStats()
        connection = sqlite3.connect(f"{index_path.as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            documents = connection.execute(
                "SELECT COUNT(*) FROM documents WHERE active = 1 AND collection = ?", (collection,)
            ).fetchone()[0]
            needs_embedding = connection.execute(
                """
                SELECT COUNT(DISTINCT d.hash) FROM documents d
                LEFT JOIN (SELECT hash, COUNT(*) AS chunks, MAX(total_chunks) AS expected
                           FROM content_vectors GROUP BY hash) v ON v.hash = d.hash
                WHERE d.active = 1 AND d.collection = ? AND (v.hash IS NULL OR v.chunks < v.expected)
                """,
                (collection,),
            ).fetchone()[0]
        finally:
            connection.close()
    except (OSError, sqlite3.Error) as exc:
        logger.debug("cannot read qmd index {}: {}", index_path, exc)
        return IndexStats()
    return IndexStats(documents, needs_embedding, iso_time(max(write_times)))


def collection_fields(text: str) -> dict[str, str]:
    """Path and Pattern from `qmd collection show` (it has no JSON output)."""
    fields = {}
    for line in ANSI_ESCAPE.sub("", text).splitlines():
        key, separator, value = line.strip().partition(":")
        if separator and key in ("Path", "Pattern"):
            fields[key] = value.strip()
    return fields


def json_array(stdout: str) -> list:
    """The JSON array a `--format json` search printed; SearchBackendError when it is not one."""
    # Warnings go to stderr, but be lenient about a stray line before the JSON.
    start = stdout.find("[")
    try:
        return json.loads(stdout[start:] if start >= 0 else stdout)
    except ValueError as exc:
        raise SearchBackendError(f"qmd printed something that is not JSON: {stdout[:200]!r}") from exc


def iso_time(timestamp: float) -> str:
    """A POSIX timestamp as ISO 8601 text in UTC."""
    return datetime.fromtimestamp(timestamp, tz=UTC).isoformat(timespec="seconds")
