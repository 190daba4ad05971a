"""The budgeted memory context an agent asks for: what matches its query, then recent history.
Never over budget (tiktoken on the final text); history is read backwards in bounded blocks, bad UTF-8 replaced."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nanobotd import fsio
from nanobotd.config.paths import MEMORY_FILES
from nanobotd.index.hit import SearchBackendError, SearchHit
from nanobotd.memory.history import HISTORY_NAME, HistoryEntry, lines_from_end, parse_entry, read_dream_cursor
from nanobotd.sessions.file import SessionHeader, read_header
from nanobotd.tokens import DEFAULT_ENCODING, count_tokens, get_encoding

# nanobot 0.3.5 puts these into every system prompt itself (agent/context.py: ContextBuilder.BOOTSTRAP_FILES,
# and memory/MEMORY.md as its long-term memory): shown again they would spend the budget on what the agent has.
AGENT_INJECTED = frozenset({"AGENTS.md", *MEMORY_FILES})
SEARCH_LIMIT = 10
# Hits already in the context are skipped, so more are asked for than are shown.
SEARCH_FETCH = 30
MIN_PART_TOKENS = 8
BUDGET_MARKER = "[... cut to fit the token budget]"
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

    def remaining(self, limit: int | None = None) -> int:
        """The tokens left for another part (each part costs one more, its separator), at most *limit*."""
        room = self.budget - sum(tokens for _, tokens in self.parts) - len(self.parts) - 1
        return room if limit is None else min(room, limit)

    def fits(self, part: Part, limit: int | None = None) -> int | None:
        """The tokens *part* costs if it fits in what is left (and within *limit*), else None."""
        tokens = count_tokens(part.render())
        return tokens if tokens <= self.remaining(limit) else None

    def add(self, part: Part, tokens: int) -> None:
        """Accept a part whose cost was checked with fits()."""
        self.parts.append((part, tokens))

    def offer(self, part: Part, limit: int | None = None) -> None:
        """Accept *part*, its head cut to fit when it does not; omitted when too little of it fits."""
        tokens = self.fits(part, limit)
        cut = part if tokens is not None else trim_part(part, self.remaining(limit))
        if cut is None:
            self.omitted.append({"name": part.name, "reason": "budget"})
        else:
            self.add(cut, tokens if cut is part else count_tokens(cut.render()))

    def finish(self) -> tuple[str, int]:
        """The final text and its exact token count, dropping trailing parts in the rare case it overflows."""
        while True:
            text = "\n".join(part.render() for part, _ in self.parts)
            tokens = count_tokens(text)
            if tokens <= self.budget or not self.parts:
                return (text, tokens) if tokens <= self.budget else ("", 0)
            part, _ = self.parts.pop()
            self.omitted.append({"name": part.name, "reason": "budget"})


def build_context(workspace: Path, *, budget_tokens: int, query: str = "",
                  search: Callable[[str, int], list[SearchHit]] | None = None,
                  session_key: str | None = None) -> dict:
    """The context for an agent turn within *budget_tokens*: hits for *query*, then history since the dream cursor.
    Left out, being in the agent's prompt already: AGENT_INJECTED files, and *session_key*'s unarchived messages."""
    assembly = Assembly(budget_tokens)
    shown = add_search(assembly, Path(workspace), query, search, session_key)
    add_history(assembly, Path(workspace) / "memory", assembly.remaining(), shown)
    text, tokens = assembly.finish()
    return {
        "text": text,
        "tokens": tokens,
        "budget_tokens": budget_tokens,
        "parts": [{"name": part.name, "tokens": count, "chars": len(part.render()), "truncated": part.truncated}
                  for part, count in assembly.parts],
        "omitted": assembly.omitted,
    }


# -- trimming ---------------------------------------------------------------------------------------

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

def add_history(assembly: Assembly, memory_dir: Path, room: int, shown: list[str]) -> None:
    """Entries after the dream cursor, newest first while they fit in *room*, leaving out those whose text
    a search hit showed already (*shown*). The chosen entries are shown oldest first, as a timeline."""
    name = "Recent history"
    after = read_dream_cursor(memory_dir)
    chosen: list[str] = []
    used = count_tokens(Part(name, "").render()) + 1
    try:
        for entry in entries_newest_first(memory_dir / HISTORY_NAME, after):
            if any(text in entry.content for text in shown):
                continue
            line = render_entry(entry)
            tokens = count_tokens(line) + 1
            if used + tokens > room:
                if not chosen:
                    # The newest entry alone is too big: show its head rather than nothing.
                    assembly.offer(Part(name, line), room)
                    return
                break
            chosen.append(line)
            used += tokens
    except OSError as exc:
        assembly.omitted.append({"name": name, "reason": f"unreadable: {exc.strerror or exc}"})
        return
    if not chosen:
        assembly.omitted.append({"name": name, "reason": "no entries since the dream cursor"})
        return
    while chosen:
        part = Part(name, "\n".join(reversed(chosen)))
        tokens = assembly.fits(part, room)
        if tokens is not None:
            assembly.add(part, tokens)
            return
        chosen.pop()
    assembly.omitted.append({"name": name, "reason": "budget"})


def render_entry(entry: HistoryEntry) -> str:
    """One history entry as a context line."""
    key = f" ({entry.session_key})" if entry.session_key else ""
    return f"- [{entry.timestamp or '?'}]{key} {entry.content.strip()}"


def entries_newest_first(path: Path, after_cursor: int) -> Iterator[HistoryEntry]:
    """Valid entries with cursor > *after_cursor*, read backwards from the end in blocks (bounded memory)."""
    for line in lines_from_end(path, max_line_bytes=MAX_HISTORY_LINE_BYTES):
        entry = parse_entry(line.decode("utf-8-sig", errors="replace"))  # the first line may carry a BOM
        if entry is not None:
            if entry.cursor <= after_cursor:
                return
            yield entry


# -- search -----------------------------------------------------------------------------------------

def _already_shown(hit: SearchHit, session_key: str | None, live_from: int | None) -> bool:
    """A hit the agent's prompt holds already: a file nanobot injects, or the live session's tail."""
    if hit.source in ("memory", "note"):
        return hit.path in AGENT_INJECTED
    return (hit.source == "session" and hit.session_key == session_key and live_from is not None
            and (hit.message_start or 0) >= live_from)


def add_search(assembly: Assembly, workspace: Path, query: str,
               search: Callable[[str, int], list[SearchHit]] | None, session_key: str | None) -> list[str]:
    """Search hits for the query, best first, as many as fit, skipping what the agent's prompt holds;
    return the texts of the history hits shown (recent history leaves them out)."""
    name = "Search: " + " ".join(query.split())[:MAX_QUERY_IN_HEADER]
    if not query.strip() or search is None:
        assembly.omitted.append({"name": "Search", "reason": "no query" if search else "no search backend"})
        return []
    try:
        hits = search(query, SEARCH_FETCH)
    except SearchBackendError as exc:
        assembly.omitted.append({"name": name, "reason": f"search unavailable: {exc}"})
        return []
    live_from = _live_from(workspace, session_key, hits)
    fresh = [hit for hit in hits if not _already_shown(hit, session_key, live_from)][:SEARCH_LIMIT]
    if not fresh:
        assembly.omitted.append({"name": name, "reason": "no hits"})
        return []
    room = assembly.remaining()
    chosen: list[SearchHit] = []
    used = count_tokens(Part(name, "").render()) + 1
    for hit in fresh:
        tokens = count_tokens(render_hit(hit)) + 1
        if used + tokens <= room:
            chosen.append(hit)
            used += tokens
    while chosen:
        part = Part(name, "\n".join(map(render_hit, chosen)))
        tokens = assembly.fits(part)
        if tokens is not None:
            assembly.add(part, tokens)
            return [hit.text.strip() for hit in chosen if hit.source == "history" and hit.text.strip()]
        chosen.pop()
    assembly.offer(Part(name, render_hit(fresh[0])))  # its head only: history may show it whole
    return []


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
            record = json.loads(handle.readline(MAX_HISTORY_LINE_BYTES).decode("utf-8-sig", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("_type") != "metadata":
        return None
    read_header(record, header)
    return header.last_archived
