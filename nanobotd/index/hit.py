"""The search result every backend returns, so callers never care which backend answered."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class SearchBackendError(RuntimeError):
    """A search backend could not answer (missing, slow, failing); the caller falls back."""


@dataclass(frozen=True)
class SearchHit:
    """One ranked unit of memory and where it lives (the fields' units are noted beside them)."""

    source: str  # "memory" (a ## section of SOUL/USER/MEMORY.md), "note", "history" (an entry) or "session"
    path: str  # workspace-relative; for "session" the session file
    snippet: str
    score: float
    text: str = ""
    when: str = ""  # the best timestamp known for the unit (ISO text), "" when unknown
    line_start: int | None = None  # line_start/line_end: 1-based inclusive, in *path* (files and history.jsonl)
    line_end: int | None = None
    session_key: str | None = None
    message_start: int | None = None  # message_start/message_end: session windows, 0-based inclusive
    message_end: int | None = None
    backend: str = "builtin"
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """A plain dict for the control API."""
        return asdict(self)
