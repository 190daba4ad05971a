"""The search result every backend returns, so callers never care which backend answered."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class SearchBackendError(RuntimeError):
    """A search backend could not answer (missing, slow, failing); the caller falls back."""


@dataclass(frozen=True)
class SearchHit:
    """One ranked unit of memory and where it lives.

    source: "memory" (a ## section of SOUL/USER/MEMORY.md), "note" (daily or archived note section),
    "history" (a history.jsonl entry) or "session" (a window of session turns).
    path: workspace-relative file path; for "session" the session file path.
    line_start/line_end: 1-based inclusive line range in *path* (files and history.jsonl).
    session_key/message_start/message_end: for session windows, the 0-based message index range.
    when: the best timestamp known for the unit (ISO text), "" when unknown.
    """

    source: str
    path: str
    snippet: str
    score: float
    text: str = ""
    when: str = ""
    line_start: int | None = None
    line_end: int | None = None
    session_key: str | None = None
    message_start: int | None = None
    message_end: int | None = None
    backend: str = "builtin"
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """A plain dict for the control API."""
        return asdict(self)
