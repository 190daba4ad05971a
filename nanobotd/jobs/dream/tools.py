"""The dream's file tools (read_file, edit_file) over staged copies of three files, and the edit guard.

Whatever the conversation asks, the tools reach only SOUL.md, USER.md and memory/MEMORY.md in the workspace, never
through a symlink, and edits stay in memory until the tool loop completes; a refusal is text the model sees. nanobot
puts the three files whole into every prompt, so the guard keeps each under its cap, and while condensing (a file over
its cap) accepts only edits that shorten a file."""

from __future__ import annotations

import difflib
import os
import re
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.config.schema import ContextSettings
from nanobotd.memory.dailynote import heading_key

MEMORY_FILE = "memory/MEMORY.md"
MAX_NEW_TEXT_BYTES = 64 * 1024
MAX_EDITS_PER_CALL = 50
MAX_READ_CHARS = 60_000
MIN_GUARDED_CHARS = 100
MAX_REMOVED_SHARE = 0.5
CONDENSE_KEEP_SHARE = 0.5  # a condensing pass may shorten a file to half of what it was, not further
ERROR_PREFIX = "Error: "
DATE = r"\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2})?)?"
DATE_FIRST = re.compile(rf"^[\[(]?{DATE}")
DATE_ANYWHERE = re.compile(rf"[\[(]?{DATE}[\])]?")
URL_ONLY = re.compile(r"^(?:<?https?://\S+?>?|\[[^\]]*\]\(\s*<?https?://[^)\s]+>?\s*\))[.,;]?$", re.IGNORECASE)
LINE_LEAD = re.compile(r"^\s*(?:#+\s*|[-*+]\s+|\d+[.)]\s+)?[*_`\s]*")
SECTION_HEADING = re.compile(r"^##(?!#)\s*(.*?)\s*#*\s*$")
CAP_ADVICE = ("nanobot puts these files whole into every prompt. Make room first (merge or shorten bullets, drop "
              "stale ones) or leave this fact out")

TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read one memory file. path is one of: SOUL.md, USER.md, memory/MEMORY.md.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": list(MEMORY_FILES)}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": (
                "Apply exact text replacements to one memory file, all or nothing. Each old_text must occur "
                "exactly once in the file; include surrounding lines to make it unique."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "enum": list(MEMORY_FILES)},
                    "edits": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"old_text": {"type": "string"}, "new_text": {"type": "string"}},
                            "required": ["old_text", "new_text"],
                        },
                    },
                },
                "required": ["path", "edits"],
            },
        },
    },
]


class ToolRefused(Exception):
    """A read or edit that is not allowed or cannot apply; the message is what the model is told."""


class GuardRejected(ToolRefused):
    """The guard refused an edit that would lose memory or add noise."""


class StagedFiles:
    """In-memory copies of the allow-listed files; the dream's edits land here, never on disk."""

    def __init__(self, workspace: Path, caps: ContextSettings | None = None):
        self.workspace = Path(workspace)
        self.caps = caps
        self.root = self.workspace.resolve()
        self.base: dict[str, bytes | None] = {}
        self.current: dict[str, str] = {}
        self.unavailable: dict[str, str] = {}
        self.batches: dict[str, list[list[tuple[str, str]]]] = {}
        self.rejections: list[dict] = []
        self.condensing = False  # a condensing pass: only edits that shorten a file are accepted
        for path in MEMORY_FILES:
            self._load(path)
        self.reference = dict(self.current)  # what the guard measures removals against

    def _load(self, path: str) -> None:
        self.base[path] = None
        try:
            data = self.checked_path(path).read_bytes()
            self.current[path] = data.decode("utf-8")
            self.base[path] = data
        except FileNotFoundError:
            self.unavailable[path] = f"{path} does not exist"
        except UnicodeDecodeError:
            self.unavailable[path] = f"{path} is not valid UTF-8 text"
        except (ToolRefused, OSError) as exc:
            self.unavailable[path] = str(exc)

    # -- the tools -------------------------------------------------------------------------------
    def run(self, name: str, arguments: Any) -> str:
        """Execute one tool call; an error string (never an exception) when it is refused."""
        try:
            if not isinstance(arguments, dict):
                raise ToolRefused("arguments must be a JSON object")
            if name == "read_file":
                return self.read(arguments.get("path"))
            if name == "edit_file":
                return self.edit(arguments.get("path"), arguments.get("edits"))
            raise ToolRefused(f"unknown tool {name!r}; the tools are read_file and edit_file")
        except GuardRejected as exc:
            self.rejections.append({"path": _path_label(arguments), "reason": str(exc)})
            return ERROR_PREFIX + str(exc)
        except ToolRefused as exc:
            return ERROR_PREFIX + str(exc)

    def read(self, raw_path: Any) -> str:
        """The staged content of one allow-listed file."""
        path = self.resolve(raw_path)
        text = self._text(path)
        if len(text) > MAX_READ_CHARS:
            return text[:MAX_READ_CHARS] + f"\n... (cut at {MAX_READ_CHARS} characters)"
        return text or "(empty file)"

    def edit(self, raw_path: Any, edits: Any) -> str:
        """Apply a batch of exact replacements to one file, all or nothing, after the guard agreed."""
        path = self.resolve(raw_path)
        pairs = parse_edits(edits)
        before = self._text(path)
        after = apply_edits(before, pairs)
        if after == before:
            raise ToolRefused("the edit changes nothing")
        reason = lost_section_reason(path, before, after) or (
            condense_reason(path, self.reference[path], before, after) if self.condensing
            else guard_edit(path, self.reference[path], before, after) or self.cap_reason(path, before, after))
        if reason:
            raise GuardRejected(f"guard: {reason}")
        self.current[path] = after
        self.batches.setdefault(path, []).append(pairs)
        return f"Edited {path}: {len(pairs)} replacement(s) applied ({len(after.splitlines())} lines now)."

    def cap_reason(self, path: str, before: str, after: str) -> str | None:
        """Why an edit that grows a file must not push it (or the three files) past the caps, or None. An edit that does
        not grow the file always passes, so a file already over its cap can still shrink."""
        if self.caps is None or len(after) <= len(before):
            return None
        if len(after) > self.caps.max_chars:
            return (f"{path} would grow to {len(after):,} characters, over its cap of {self.caps.max_chars:,}"
                    f" (context.max_chars); {CAP_ADVICE}")
        total = sum(len(text) for text in self.current.values()) - len(before) + len(after)
        if total > self.caps.total_max_chars:
            return (f"{', '.join(MEMORY_FILES)} would total {total:,} characters, over their joint cap of"
                    f" {self.caps.total_max_chars:,} (context.total_max_chars); {CAP_ADVICE}")
        return None

    def sizes(self) -> dict[str, int]:
        """Characters of each staged file (as the caps count them)."""
        return {path: len(text) for path, text in self.current.items()}

    def resolve(self, raw_path: Any) -> str:
        """The allow-listed relative path named by *raw_path*, or ToolRefused."""
        if not isinstance(raw_path, str) or not raw_path.strip():
            raise ToolRefused(f"path must be one of {', '.join(MEMORY_FILES)}")
        if "\0" in raw_path:
            raise ToolRefused("path contains a NUL byte")
        pure = PurePosixPath(raw_path.strip())
        if pure.is_absolute():
            raise ToolRefused(f"absolute paths are not allowed; use one of {', '.join(MEMORY_FILES)}")
        if ".." in pure.parts:
            raise ToolRefused("'..' is not allowed in a path")
        path = str(pure)
        if path not in MEMORY_FILES:
            raise ToolRefused(f"{path} is not a file dream may touch; allowed: {', '.join(MEMORY_FILES)}")
        self.checked_path(path)
        return path

    def checked_path(self, path: str) -> Path:
        """The file itself, refusing one reached through a symlink (which may point anywhere)."""
        full = self.root / path
        real = Path(os.path.realpath(full))
        if real != full:
            target = os.readlink(full) if full.is_symlink() else str(real)
            raise ToolRefused(f"{path} is a symlink (to {target}); dream edits only regular files in the workspace")
        return full

    def _text(self, path: str) -> str:
        if path not in self.current:
            raise ToolRefused(self.unavailable.get(path, f"{path} is not available"))
        return self.current[path]

    # -- batches of the run -----------------------------------------------------------------------
    def checkpoint(self) -> tuple[dict[str, str], dict[str, int]]:
        """The staged state to come back to should the next batch not complete."""
        return dict(self.current), {path: len(pairs) for path, pairs in self.batches.items()}

    def settle(self) -> None:
        """A condensing pass completed: later edits are measured against the condensed text."""
        self.reference = dict(self.current)

    def rewind(self, mark: tuple[dict[str, str], dict[str, int]]) -> None:
        """Discard the edits made since *mark* (their refusals stay recorded)."""
        current, counts = mark
        self.current = dict(current)
        self.batches = {path: pairs[:counts.get(path, 0)] for path, pairs in self.batches.items()}

    # -- results ---------------------------------------------------------------------------------
    def changes(self) -> dict[str, tuple[bytes | None, str]]:
        """{path: (content at start, edited text)} of the files whose text changed."""
        return {
            path: (self.base[path], text)
            for path, text in self.current.items()
            if text.encode("utf-8") != self.base[path]
        }

    def replay(self, path: str, text: str) -> str:
        """Apply this run's edit batches to *text* (the file changed on disk during the run)."""
        for pairs in self.batches.get(path, []):
            text = apply_edits(text, pairs)
        return text


def parse_edits(edits: Any) -> list[tuple[str, str]]:
    """Validate edit_file's `edits` argument into (old_text, new_text) pairs."""
    if isinstance(edits, dict):
        edits = [edits]
    if not isinstance(edits, list) or not edits:
        raise ToolRefused("edits must be a non-empty list of {old_text, new_text} objects")
    if len(edits) > MAX_EDITS_PER_CALL:
        raise ToolRefused(f"at most {MAX_EDITS_PER_CALL} edits per call")
    pairs = []
    for number, edit in enumerate(edits, start=1):
        if not isinstance(edit, dict):
            raise ToolRefused(f"edit {number} must be an object with old_text and new_text")
        old_text, new_text = edit.get("old_text"), edit.get("new_text")
        if not isinstance(old_text, str) or not isinstance(new_text, str):
            raise ToolRefused(f"edit {number} needs string old_text and new_text")
        if not old_text:
            raise ToolRefused(f"edit {number} has an empty old_text")
        if old_text == new_text:
            raise ToolRefused(f"edit {number} is a no-op (old_text equals new_text)")
        pairs.append((old_text, new_text))
    new_bytes = sum(len(new_text.encode("utf-8")) for _, new_text in pairs)
    if new_bytes > MAX_NEW_TEXT_BYTES:
        raise ToolRefused(f"the edit adds {new_bytes} bytes; at most {MAX_NEW_TEXT_BYTES} per call")
    return pairs


def apply_edits(text: str, pairs: list[tuple[str, str]]) -> str:
    """Apply exact, unique replacements in order; ToolRefused when one does not match exactly once."""
    for number, (old_text, new_text) in enumerate(pairs, start=1):
        count = text.count(old_text)
        if count == 0:
            raise ToolRefused(f"edit {number}: old_text was not found; read the file and copy the text exactly")
        if count > 1:
            raise ToolRefused(f"edit {number}: old_text occurs {count} times; include more context to make it unique")
        text = text.replace(old_text, new_text, 1)
    return text


# -- the guard -------------------------------------------------------------------------------------
def guard_edit(path: str, original: str, before: str, after: str) -> str | None:
    """Why an edit that keeps every section must not be applied, or None: most of a file gone, noise in MEMORY.md."""
    for reference in (before, original):
        share = removed_share(reference, after)
        if len(reference) >= MIN_GUARDED_CHARS and share > MAX_REMOVED_SHARE:
            return f"the edit would remove {share:.0%} of {path}; make small, surgical edits instead"
    return noise_reason(path, before, after)


def condense_reason(path: str, original: str, before: str, after: str) -> str | None:
    """Why an edit of a condensing pass that keeps every section must not be applied: it does not shorten the
    file, cuts it to less than half of what it was (condensing rewords, it does not delete), or adds noise."""
    if len(after) >= len(before):
        return (f"this is a condensing pass: an edit must make {path} shorter (this one takes it from"
                f" {len(before):,} to {len(after):,} characters)")
    if len(after) < len(original) * CONDENSE_KEEP_SHARE:
        return (f"the edit would cut {path} to {len(after) / len(original):.0%} of its size; condense the wording"
                " and merge bullets, do not drop facts")
    return noise_reason(path, before, after)


def lost_section_reason(path: str, before: str, after: str) -> str | None:
    """Why an edit that drops a whole `##` section must not be applied, or None."""
    lost = Counter(map(heading_key, section_titles(before))) - Counter(map(heading_key, section_titles(after)))
    if not lost:
        return None
    title = next(title for title in section_titles(before) if heading_key(title) in lost)
    return f"the edit would remove the whole section '## {title}' from {path}; keep it and edit its bullets"


def noise_reason(path: str, before: str, after: str) -> str | None:
    """Why lines an edit adds to MEMORY.md are journal noise, or None."""
    if path != MEMORY_FILE:
        return None
    for line in added_lines(before, after):
        reason = noisy_line_reason(line)
        if reason:
            return f"{reason} in {path} ({line.strip()[:80]!r}); state the lasting fact itself"
    return None


def section_titles(text: str) -> list[str]:
    """The `##` section titles of a markdown text."""
    return [match.group(1) for match in map(SECTION_HEADING.match, text.splitlines()) if match]


def removed_share(before: str, after: str) -> float:
    """The share of *before*'s characters on lines that *after* no longer has."""
    if not before:
        return 0.0
    old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    return sum(len(line) for tag, start, end, _, _ in _line_changes(old_lines, new_lines)
               if tag in ("replace", "delete") for line in old_lines[start:end]) / len(before)


def added_lines(before: str, after: str) -> list[str]:
    """Lines of *after* that *before* did not have."""
    old_lines, new_lines = before.splitlines(), after.splitlines()
    return [line for tag, _, _, start, end in _line_changes(old_lines, new_lines)
            if tag in ("replace", "insert") for line in new_lines[start:end]]


def _line_changes(old_lines: list[str], new_lines: list[str]) -> list[tuple[str, int, int, int, int]]:
    return difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()


def noisy_line_reason(line: str) -> str | None:
    """Why a new MEMORY.md line is journal noise (date-stamped or a bare URL), or None."""
    body = LINE_LEAD.sub("", line).strip()
    if not body:
        return None
    if DATE_FIRST.match(body):
        return "date-stamped lines do not belong"
    dated = sum(len(match.group(0)) for match in DATE_ANYWHERE.finditer(body))
    if dated and dated * 2 >= len(body):
        return "date-stamped lines do not belong"
    if URL_ONLY.match(body):
        return "a line that is only a URL does not belong"
    return None


def _path_label(arguments: Any) -> str:
    path = arguments.get("path") if isinstance(arguments, dict) else None
    return path if isinstance(path, str) else "?"
