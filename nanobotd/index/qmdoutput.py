"""What qmd prints and stores, read back: JSON search results, `collection show`, and its SQLite index. QMD's
formats are no stable API (no machine-readable `qmd status`), so every parse lives here, for a new qmd to check."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

from loguru import logger

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.index.hit import SearchBackendError, SearchHit
from nanobotd.index.qmdexport import Location, QmdExport
from nanobotd.index.query import parse_query

HUNK_PATTERN = re.compile(r"^@@ -(\d+),(\d+) @@")
HTTP_LINE_NUMBER = re.compile(r"^\d+: ?")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NOTE_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})\.md$")
MAX_LEX_TERMS = 8
NODE_ERROR_LINE = re.compile(r"^[A-Za-z]*Error\b.*:")
NODE_NOISE_LINE = re.compile(r"^(at |Node\.js v|\^+$|throw )")


@dataclass(frozen=True)
class QmdResult:
    """What a finished qmd call printed and how it exited."""

    returncode: int
    stdout: str
    stderr: str

    def error_text(self) -> str:
        """The most telling stderr (or stdout) line for an error message: a Node error beats the last line."""
        for stream in (self.stderr, self.stdout):
            lines = [line.strip() for line in stream.splitlines() if line.strip()]
            errors = [line for line in lines if NODE_ERROR_LINE.match(line)]
            meaningful = [line for line in lines if not NODE_NOISE_LINE.match(line)]
            if errors or meaningful:
                return (errors or meaningful)[-1][:300]
        return f"exit status {self.returncode}"


@dataclass(frozen=True)
class IndexStats:
    """Counts read straight from QMD's SQLite index (`qmd status` has no machine-readable output)."""

    documents: int | None = None
    needs_embedding: int | None = None
    last_write: str | None = None


def lexical_searches(query: str) -> list[dict]:
    """QMD ANDs the words of a lex search, so a question finds nothing unless one document holds them all:
    the query's words together, and each of its distinctive words alone, fused by QMD's rank fusion."""
    terms = parse_query(query).terms[:MAX_LEX_TERMS]
    searches = [{"type": "lex", "query": " ".join(terms) or query}]
    return searches + [{"type": "lex", "query": term} for term in terms if len(terms) > 1]


def normalize_query(query: str) -> str:
    """One line with balanced quotes: QMD rejects newlines and a lone double quote."""
    text = " ".join(query.split())
    if text.count('"') % 2:
        text = " ".join(text.replace('"', " ").split())
    return text


def hits_from_results(items: object, collection: str, export: tuple[str, QmdExport] | None, workspace: Path,
                      *, mode: str, transport: str) -> list[SearchHit]:
    """SearchHits from a QMD answer: memory files of *collection*, history and sessions of the export."""
    if not isinstance(items, list):
        raise SearchBackendError(f"qmd {mode} answered {type(items).__name__}, expected a list")
    hits = []
    for item in items:
        if not isinstance(item, dict):
            raise SearchBackendError(f"qmd {mode} result is not an object: {item!r:.200}")
        snippet, line_start, line_end = parse_snippet(
            str(item.get("snippet", "")), item.get("line"), numbered=transport == "mcp")
        try:
            score = float(item.get("score", 0.0))
        except (TypeError, ValueError):
            score = 0.0
        if (path := collection_path(item, collection)) is not None:
            source = "memory" if path in MEMORY_FILES else "note"
            date = NOTE_DATE.search(path) if source == "note" else None
            extra = {"docid": item.get("docid", ""), "title": item.get("title", ""), "mode": mode,
                     "transport": transport}
            hits.append(SearchHit(source=source, path=path, snippet=snippet, score=score,
                                  when=date.group(1) if date else "", line_start=line_start, line_end=line_end,
                                  backend="qmd", extra=extra))
        elif export is not None and (relative := collection_path(item, export[0])) is not None:
            found = export[1].locate(relative, line_start, line_end)
            if found is not None:
                extra = {"docid": item.get("docid", ""), "mode": mode, "transport": transport, "export": relative}
                hits.append(export_hit(found, workspace, snippet, score, extra))
    return hits


def export_hit(found: Location, workspace: Path, snippet: str, score: float, extra: dict) -> SearchHit:
    """A hit in the exported history and sessions, located by the headings of its lines."""
    try:
        path = Path(found.path).relative_to(workspace).as_posix()
    except ValueError:
        path = found.path
    common = dict(source=found.source, path=path, snippet=snippet.strip() or found.text[:240], score=score,
                  text=found.text, when=found.when, session_key=found.session_key, backend="qmd", extra=extra)
    if found.source == "session":
        return SearchHit(**common, message_start=found.first, message_end=found.last)
    first_line, last_line = found.history_lines or (None, None)
    return SearchHit(**common, line_start=first_line or None, line_end=last_line or None)


def collection_path(item: dict, collection: str) -> str | None:
    """The path of a QMD result's file inside *collection* (`qmd://NAME/path?...`), or None for another's."""
    prefix = f"qmd://{collection}/"
    location = str(item.get("file", "")).split("?", 1)[0]
    return unquote(location[len(prefix):]) if location.startswith(prefix) else None


def parse_snippet(snippet: str, line: object, *, numbered: bool) -> tuple[str, int | None, int | None]:
    """Split QMD's `@@ -start,count @@` header, which gives the line range, off a snippet.
    With *numbered* (the HTTP server), the number it prefixes to every line is dropped too."""
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
    """Document and pending-embedding counts of *collection*, read-only; empty stats when unreadable. Pending: distinct
    content hashes without a full set of vectors, as `qmd status` counts, but for any embedding model."""
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
