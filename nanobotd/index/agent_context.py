"""The budgeted memory context an agent injects: bootstrap files, MEMORY.md, recent history, search hits.

Parts come in a fixed priority order and the whole text never exceeds the token budget, counted
exactly with tiktoken on the final text. Files are read with bounded work whatever their size (head
and tail only, characters counted in a streaming pass) and bad UTF-8 is replaced, never fatal.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nanobotd import fsio
from nanobotd.config.schema import ContextSettings
from nanobotd.fsio import read_text_lossy
from nanobotd.index.hit import SearchBackendError, SearchHit
from nanobotd.memory.history import DREAM_CURSOR_NAME, HISTORY_NAME, HistoryEntry, parse_entry, read_cursor_file
from nanobotd.sessions.file import SessionHeader, read_header
from nanobotd.tokens import DEFAULT_ENCODING, count_tokens, get_encoding

BOOTSTRAP_FILES = ("AGENTS.md", "SOUL.md", "USER.md")
MEMORY_FILE = "memory/MEMORY.md"
HEAD_SHARE = 0.7
TAIL_SHARE = 0.2
SEARCH_LIMIT = 10
# Hits already in the context are skipped, so more are asked for than are shown.
SEARCH_FETCH = 30
# With a query, this share of what the files leave is kept for search hits; history gets the rest first.
SEARCH_SHARE = 0.3
MIN_PART_TOKENS = 8
BUDGET_MARKER = "[... cut to fit the token budget]"
READ_CHUNK = 1024 * 1024
HISTORY_BLOCK = 64 * 1024
MAX_HISTORY_LINE_BYTES = 1024 * 1024
MAX_QUERY_IN_HEADER = 200


@dataclass
class Part:
    """One labelled section of the context."""

    name: str
    body: str
    truncated: bool = False

    def render(self) -> str:
        """The section as it appears in the text."""
        return f"## {self.name}\n{self.body}\n"


class Assembly:
    """Parts accepted so far and the tokens they cost (one token per separator, to stay on the safe side)."""

    def __init__(self, budget: int):
        self.budget = max(0, budget)
        self.parts: list[tuple[Part, int]] = []
        self.omitted: list[dict] = []

    @property
    def used(self) -> int:
        return sum(tokens for _, tokens in self.parts) + len(self.parts)

    def remaining(self) -> int:
        return self.budget - self.used - 1

    def fits(self, part: Part, limit: int | None = None) -> int | None:
        """The tokens *part* costs if it fits in what is left (and within *limit*), else None."""
        room = self.remaining() if limit is None else min(self.remaining(), limit)
        tokens = count_tokens(part.render())
        return tokens if tokens <= room else None

    def add(self, part: Part, tokens: int) -> None:
        """Accept a part whose cost was checked with fits()."""
        self.parts.append((part, tokens))

    def offer(self, part: Part, *, trim: bool = False, limit: int | None = None) -> Part | None:
        """Accept *part* (with *trim*, cut to fit) and return what was accepted; None when omitted."""
        tokens = self.fits(part, limit)
        if tokens is not None:
            self.add(part, tokens)
            return part
        if trim:
            room = self.remaining() if limit is None else min(self.remaining(), limit)
            cut = trim_part(part, room)
            if cut is not None:
                self.add(cut, count_tokens(cut.render()))
                return cut
        self.omitted.append({"name": part.name, "reason": "budget"})
        return None

    def finish(self) -> tuple[str, int]:
        """The final text and its exact token count, dropping trailing parts in the rare case it overflows."""
        while True:
            text = "\n".join(part.render() for part, _ in self.parts)
            tokens = count_tokens(text)
            if tokens <= self.budget or not self.parts:
                return (text, tokens) if tokens <= self.budget else ("", 0)
            part, _ = self.parts.pop()
            self.omitted.append({"name": part.name, "reason": "budget"})


def build_context(workspace: Path, *, settings: ContextSettings, budget_tokens: int, query: str = "",
                  search: Callable[[str, int], list[SearchHit]] | None = None,
                  session_key: str | None = None) -> dict:
    """The memory context for an agent turn, within *budget_tokens*.

    Order: AGENTS.md, SOUL.md, USER.md (char caps), memory/MEMORY.md, history since the dream cursor,
    search hits for *query*. With a query, history may use at most 70% of what the files leave, so
    the hits always get room. Hits already shown whole (a file, a history entry) are skipped, and
    with *session_key* so are hits from that session's messages the agent has not archived yet:
    they are still in its prompt.
    """
    workspace = Path(workspace)
    assembly = Assembly(budget_tokens)
    included_files: set[str] = set()
    total_left = settings.total_max_chars
    for name in BOOTSTRAP_FILES:
        cap = min(settings.max_chars, total_left)
        part = file_part(workspace / name, name, cap, assembly.omitted)
        if part is None:
            continue
        total_left -= len(part.body)
        accepted = assembly.offer(part, trim=True)
        if accepted is not None and not accepted.truncated:
            included_files.add(name)
    part = file_part(workspace / MEMORY_FILE, MEMORY_FILE, settings.max_chars, assembly.omitted)
    accepted = assembly.offer(part, trim=True) if part is not None else None
    if accepted is not None and not accepted.truncated:
        included_files.add(MEMORY_FILE)
    reserve = int(assembly.remaining() * SEARCH_SHARE) if query.strip() and search is not None else 0
    history_shown = add_history(assembly, workspace / "memory", assembly.remaining() - reserve)
    add_search(assembly, workspace, query, search, session_key, included_files, history_shown)
    text, tokens = assembly.finish()
    return {
        "text": text,
        "tokens": tokens,
        "budget_tokens": budget_tokens,
        "parts": [{"name": part.name, "tokens": count, "chars": len(part.render()), "truncated": part.truncated}
                  for part, count in assembly.parts],
        "omitted": assembly.omitted,
    }


# -- files ------------------------------------------------------------------------------------------

def file_part(path: Path, name: str, cap: int, omitted: list[dict]) -> Part | None:
    """A file as a part, cut to *cap* characters; None (with the reason noted) when there is nothing."""
    if cap <= 0:
        omitted.append({"name": name, "reason": "total_max_chars"})
        return None
    try:
        text, cut = read_capped(path, name, cap)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        omitted.append({"name": name, "reason": "missing"})
        return None
    except OSError as exc:
        omitted.append({"name": name, "reason": f"unreadable: {exc.strerror or exc}"})
        return None
    if not text.strip():
        omitted.append({"name": name, "reason": "empty"})
        return None
    return Part(name, text.strip("\n"), truncated=cut > 0)


def read_capped(path: Path, name: str, cap: int) -> tuple[str, int]:
    """(text, chars cut): the whole file, or its head (70% of *cap*) and tail (20%) around a marker line."""
    if os.stat(path).st_size <= cap:
        return read_text_lossy(path), 0
    total = count_chars(path)
    if total <= cap:
        return read_text_lossy(path), 0
    head_chars, tail_chars = int(cap * HEAD_SHARE), int(cap * TAIL_SHARE)
    head = read_text_lossy(path, limit=head_chars * 4 + 4)[:head_chars]
    tail = read_tail(path, tail_chars * 4 + 4)[-tail_chars:] if tail_chars else ""
    cut = total - len(head) - len(tail)
    return f"{head}\n[... {name}: {cut} chars cut ...]\n{tail}", cut


def count_chars(path: Path) -> int:
    """Characters of the file as decoded with replacement, in one streaming pass."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    total = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            total += len(decoder.decode(chunk))
    return total + len(decoder.decode(b"", final=True))


def read_tail(path: Path, size: int) -> str:
    """The last *size* bytes of a file, decoded with replacement (a cut first character is dropped)."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        start = max(0, handle.tell() - size)
        handle.seek(start)
        data = handle.read()
    if start:
        while data and (data[0] & 0xC0) == 0x80:
            data = data[1:]
    return data.decode("utf-8", errors="replace")


def trim_part(part: Part, room: int) -> Part | None:
    """*part* with its body cut to fit *room* tokens (the head is kept), or None when too little fits."""
    header_tokens = count_tokens(Part(part.name, BUDGET_MARKER).render())
    keep = room - header_tokens - 2
    if keep < MIN_PART_TOKENS:
        return None
    encoding = get_encoding(DEFAULT_ENCODING)
    ids = encoding.encode(part.body[: keep * 16], disallowed_special=())[:keep]
    head = encoding.decode(ids).rstrip("\ufffd")
    for _ in range(4):
        candidate = Part(part.name, f"{head}\n{BUDGET_MARKER}", truncated=True)
        if count_tokens(candidate.render()) <= room:
            return candidate
        head = head[: int(len(head) * 0.9)]
    return None


# -- history ----------------------------------------------------------------------------------------

def add_history(assembly: Assembly, memory_dir: Path, room: int) -> list[str]:
    """Entries after the dream cursor, newest first while they fit; return the contents shown.

    The chosen entries are shown oldest first, so they read as a timeline.
    """
    name = "Recent history"
    after = read_cursor_file(memory_dir / DREAM_CURSOR_NAME)
    chosen: list[tuple[HistoryEntry, str]] = []
    used = count_tokens(Part(name, "").render()) + 1
    try:
        for entry in entries_newest_first(memory_dir / HISTORY_NAME, after):
            line = render_entry(entry)
            tokens = count_tokens(line) + 1
            if used + tokens > room:
                if not chosen:
                    # The newest entry alone is too big: show its head rather than nothing.
                    accepted = assembly.offer(Part(name, line), trim=True, limit=room)
                    return [entry.content] if accepted is not None else []
                break
            chosen.append((entry, line))
            used += tokens
    except OSError as exc:
        assembly.omitted.append({"name": name, "reason": f"unreadable: {exc.strerror or exc}"})
        return []
    if not chosen:
        assembly.omitted.append({"name": name, "reason": "no entries since the dream cursor"})
        return []
    while chosen:
        part = Part(name, "\n".join(line for _, line in reversed(chosen)))
        tokens = assembly.fits(part, room)
        if tokens is not None:
            assembly.add(part, tokens)
            return [entry.content for entry, _ in chosen]
        chosen.pop()
    assembly.omitted.append({"name": name, "reason": "budget"})
    return []


def render_entry(entry: HistoryEntry) -> str:
    """One history entry as a context line."""
    key = f" ({entry.session_key})" if entry.session_key else ""
    return f"- [{entry.timestamp or '?'}]{key} {entry.content.strip()}"


def entries_newest_first(path: Path, after_cursor: int) -> Iterator[HistoryEntry]:
    """Valid entries with cursor > *after_cursor*, read backwards from the end in blocks (bounded memory)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        handle.seek(0, os.SEEK_END)
        position = handle.tell()
        pending, skipping = b"", False
        while position > 0:
            step = min(HISTORY_BLOCK, position)
            position -= step
            handle.seek(position)
            pieces = (handle.read(step) + pending).split(b"\n")
            if skipping:
                if len(pieces) == 1:
                    continue
                pieces, skipping = pieces[:-1], False
            pending = pieces[0]
            for raw in reversed(pieces[1:]):
                entry = _entry(raw)
                if entry is not None:
                    if entry.cursor <= after_cursor:
                        return
                    yield entry
            if len(pending) > MAX_HISTORY_LINE_BYTES:
                pending, skipping = b"", True
        entry = None if skipping else _entry(pending)
        if entry is not None and entry.cursor > after_cursor:
            yield entry


def _entry(raw: bytes) -> HistoryEntry | None:
    if not raw.strip():
        return None
    return parse_entry(raw.decode("utf-8", errors="replace"))


# -- search -----------------------------------------------------------------------------------------

def _already_shown(hit: SearchHit, included_files: set[str], history_shown: list[str], session_key: str | None,
                   live_from: int | None) -> bool:
    """A hit the context holds already: an included file, a shown history entry, the live session's tail."""
    if hit.source in ("memory", "note"):
        return hit.path in included_files
    if hit.source == "history":
        return any(hit.text.strip() in content for content in history_shown)
    return (hit.source == "session" and hit.session_key == session_key and live_from is not None
            and (hit.message_start or 0) >= live_from)


def add_search(assembly: Assembly, workspace: Path, query: str,
               search: Callable[[str, int], list[SearchHit]] | None, session_key: str | None,
               included_files: set[str], history_shown: list[str]) -> None:
    """Search hits for the query, best first, skipping what the context or the live session already holds."""
    name = "Search: " + " ".join(query.split())[:MAX_QUERY_IN_HEADER]
    if not query.strip() or search is None:
        assembly.omitted.append({"name": "Search", "reason": "no query" if search else "no search backend"})
        return
    try:
        hits = search(query, SEARCH_FETCH)
    except SearchBackendError as exc:
        assembly.omitted.append({"name": name, "reason": f"search unavailable: {exc}"})
        return
    live_from = _live_from(workspace, session_key, hits)
    fresh = [hit for hit in hits if not _already_shown(hit, included_files, history_shown, session_key, live_from)]
    blocks = [render_hit(hit) for hit in fresh[:SEARCH_LIMIT]]
    if not blocks:
        assembly.omitted.append({"name": name, "reason": "no hits"})
        return
    header_tokens = count_tokens(Part(name, "").render()) + 1
    room = assembly.remaining()
    chosen, used = [], header_tokens
    for block in blocks:
        tokens = count_tokens(block) + 1
        if used + tokens <= room:
            chosen.append(block)
            used += tokens
    while chosen:
        part = Part(name, "\n".join(chosen))
        tokens = assembly.fits(part)
        if tokens is not None:
            assembly.add(part, tokens)
            return
        chosen.pop()
    assembly.offer(Part(name, blocks[0]), trim=True)


def render_hit(hit: SearchHit) -> str:
    """A hit with where it lives and when."""
    if hit.source == "session":
        place = f"session {hit.session_key} messages {hit.message_start}-{hit.message_end}"
    elif hit.line_start is not None:
        place = f"{hit.path}:{hit.line_start}-{hit.line_end}"
    else:
        place = hit.path
    when = f" ({hit.when})" if hit.when else ""
    return f"### {place}{when}\n{(hit.text or hit.snippet).strip()}"


def _live_from(workspace: Path, session_key: str | None, hits: list[SearchHit]) -> int | None:
    """First message of the asking session the agent has not archived (still in its prompt), if known."""
    if not session_key:
        return None
    for hit in hits:
        if hit.source == "session" and hit.session_key == session_key:
            path = Path(hit.path) if Path(hit.path).is_absolute() else workspace / hit.path
            return _archive_mark(path)
    return None


def _archive_mark(path: Path) -> int | None:
    header = SessionHeader()
    try:
        with fsio.open_regular(path) as handle:
            record = json.loads(handle.readline(MAX_HISTORY_LINE_BYTES).decode("utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("_type") != "metadata":
        return None
    read_header(record, header)
    return header.last_archived
