"""History entries and session transcripts as markdown in the state dir, for QMD, which reads only markdown.

Entries and messages go into small numbered files (ENTRIES_PER_FILE, MESSAGES_PER_FILE) under `##` headings naming
their source, and a refresh writes only files whose text changed (manifest.json), so `qmd update` re-reads little.
`locate` turns a QMD hit's lines back into the session key and message range, or the history cursor and line."""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from nanobotd.index.sessionunits import decode_line, is_skipped_session, render_message, session_key_for
from nanobotd.index.sources import SourceSet, file_fingerprint
from nanobotd.index.units import parse_timestamp, text_digest
from nanobotd.memory.history import iter_lines, parse_entry
from nanobotd.sessions.file import is_metadata_line, iter_raw_lines

ENTRIES_PER_FILE = 20
MESSAGES_PER_FILE = 10
MANIFEST = "manifest.json"
# Bump when what is exported changes: every source is then exported again (2: memory tool calls left out).
EXPORT_VERSION = 2
HEADING = re.compile(r"^## (?:#(\d+)|history #(\d+)) · ")
FILE_KEY = re.compile(r"^<!-- (session|history) (.*?) -->$")


@dataclass(frozen=True)
class Location:
    """Where an exported heading's text came from."""

    source: str  # "session" or "history"
    path: str  # the source file (absolute)
    session_key: str | None
    first: int  # session: first message position; history: first cursor
    last: int
    when: str
    text: str
    history_lines: tuple[int, int] | None = None


class QmdExport:
    """Keeps `<export_dir>` a markdown mirror of a workspace's history and session files."""

    def __init__(self, export_dir: Path, sources: SourceSet):
        self.export_dir = Path(export_dir)
        self.sources = sources

    def sync(self) -> dict:
        """Bring the export up to date; only changed sources are read and only changed files written."""
        manifest = self._read_manifest()
        files: dict[str, dict] = manifest.setdefault("sources", {})
        totals = {"sources_read": 0, "files_written": 0, "files_removed": 0}
        current = {path: kind for path, kind in self.sources.all().items() if kind in ("history", "session")}
        for path in [path for path in files if path not in current]:
            self._apply(files.pop(path).get("files", {}), {}, totals)
        for path, kind in current.items():
            record = files.get(path, {})
            try:
                fingerprint = file_fingerprint(path)
                if fingerprint is None or record.get("fingerprint") == fingerprint:
                    continue
                rendered = _history_files(Path(path)) if kind == "history" else self._session_files(Path(path))
            except OSError as exc:
                logger.warning("cannot export {} for qmd: {}", path, exc)
                continue
            totals["sources_read"] += 1
            files[path] = {"fingerprint": fingerprint, "files": self._apply(record.get("files", {}), rendered, totals)}
        self._write(MANIFEST, json.dumps(manifest))
        return totals

    def locate(self, relative: str, line_start: int | None, line_end: int | None) -> Location | None:
        """The entries or messages an exported file holds between two lines (1-based), or None."""
        try:
            lines = (self.export_dir / relative).read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError):
            return None
        header = FILE_KEY.match(lines[0]) if lines else None
        if header is None:
            return None
        source, origin = header.group(1), json.loads(header.group(2))
        sections = _sections(lines)
        first_line, last_line = line_start or 1, line_end or line_start or len(lines)
        chosen = [section for section in sections if section[1] <= last_line and section[2] >= first_line]
        chosen = chosen or sections[:1]
        if not chosen:
            return None
        text = "\n".join("\n".join(lines[start - 1:end]) for _, start, end, _ in chosen).strip()
        when = chosen[0][3]
        numbers = [number for number, _, _, _ in chosen]
        history_lines = tuple(origin.get("lines", {}).get(str(number), 0) for number in (numbers[0], numbers[-1]))
        key = origin.get("key") if source == "session" else origin.get("keys", {}).get(str(numbers[0]))
        return Location(source, origin["path"], key, numbers[0], numbers[-1], when, text,
                        history_lines if source == "history" else None)

    # -- writing -----------------------------------------------------------------------------------

    def _apply(self, old: dict, rendered: dict[str, str], totals: dict) -> dict[str, str]:
        """Write the files whose digest changed, delete those no longer wanted (counted in *totals*); the digests."""
        wanted = {}
        for name, text in rendered.items():
            wanted[name] = digest = text_digest(text)
            totals["files_written"] += old.get(name) != digest
            if old.get(name) != digest or not (self.export_dir / name).exists():
                self._write(name, text)
        for name in old.keys() - rendered.keys():
            with contextlib.suppress(FileNotFoundError):
                (self.export_dir / name).unlink()
            totals["files_removed"] += 1
        return wanted

    def _write(self, name: str, text: str) -> None:
        # A cache rebuilt from the workspace at will: rename for readers, no fsync.
        target = self.export_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.tmp")
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, target)

    def _read_manifest(self) -> dict:
        try:
            manifest = json.loads((self.export_dir / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = {}
        if not isinstance(manifest, dict) or manifest.get("version") != EXPORT_VERSION:
            manifest = {"version": EXPORT_VERSION, "sources": {}}
        return manifest

    def _session_files(self, path: Path) -> dict[str, str]:
        key = session_key_for(path)
        if is_skipped_session(key):
            return {}
        origin = json.dumps({"path": str(path), "key": key}, ensure_ascii=False)
        blocks: dict[int, list[str]] = {}
        position = 0
        for line in iter_raw_lines(path):
            if is_metadata_line(line):
                continue
            record = decode_line(line.data)
            rendered = render_message(record) if record is not None else None
            if rendered is not None:
                text, timestamp = rendered
                blocks.setdefault(position // MESSAGES_PER_FILE, []).append(
                    f"## #{position} · {_when(timestamp)}\n\n{text}\n")
            position += 1
        folder = f"sessions/{path.name.removesuffix('.jsonl')}"
        return {f"{folder}/m{block * MESSAGES_PER_FILE:06d}.md":
                f"<!-- session {origin} -->\n# Session {key or path.name}\n\n" + "\n".join(sections)
                for block, sections in blocks.items()}


def _history_files(path: Path) -> dict[str, str]:
    blocks: dict[int, list[str]] = {}
    lines: dict[int, dict[str, int]] = {}
    keys: dict[int, dict[str, str]] = {}
    for number, raw in iter_lines(path):  # line by line: history.jsonl can be tens of MB
        entry = parse_entry(raw, number)
        if entry is None or not entry.content.strip():
            continue
        block = entry.cursor // ENTRIES_PER_FILE
        session = f" · session {entry.session_key}" if entry.session_key else ""
        blocks.setdefault(block, []).append(
            f"## history #{entry.cursor} · {_when(entry.timestamp)}{session}\n\n{entry.content.strip()}\n")
        lines.setdefault(block, {})[str(entry.cursor)] = number
        if entry.session_key:
            keys.setdefault(block, {})[str(entry.cursor)] = entry.session_key
    files = {}
    for block, sections in blocks.items():
        origin = json.dumps({"path": str(path), "lines": lines[block], "keys": keys.get(block, {})},
                            ensure_ascii=False)
        first = block * ENTRIES_PER_FILE
        files[f"history/c{first:07d}.md"] = f"<!-- history {origin} -->\n# History\n\n" + "\n".join(sections)
    return files


def _sections(lines: list[str]) -> list[tuple[int, int, int, str]]:
    """(number, first line, last line, when) of every `##` section of an exported file (1-based lines)."""
    found = []
    for index, line in enumerate(lines, start=1):
        match = HEADING.match(line)
        if match:
            when = line.split(" · ")[1] if line.count(" · ") else ""
            found.append([int(match.group(1) or match.group(2)), index, len(lines), when])
    for current, following in zip(found, found[1:], strict=False):
        current[2] = following[1] - 1
    return [tuple(section) for section in found]


def _when(timestamp: str) -> str:
    moment = parse_timestamp(timestamp)
    return moment.isoformat(timespec="minutes").replace("T", " ") if moment else (timestamp or "?")
