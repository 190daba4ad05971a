"""The dream's prompts: phase 1 (what changed?) and phase 2 (apply it with surgical edits), and reading phase 1's
answer; apart from the job, so the wording can change without touching the control flow."""

from __future__ import annotations

import re
from collections.abc import Iterable

from loguru import logger

from nanobotd.jobs.dream.inputs import ENTRY_SHOWN_CHARS, NoteItem
from nanobotd.memory.history import THINK_BLOCK, HistoryEntry

FILE_SHOWN_CHARS = 20_000
CUT_MARK = "\n... (cut)"
FINDING = re.compile(r"^\[(USER|SOUL|MEMORY)\]\s*(\S.*)$")
SKIP_LINE = "[SKIP]"

ANALYSIS_SYSTEM = """\
You maintain an assistant's long-term memory files:
- SOUL.md: how the assistant behaves (tone, style, standing instructions about itself).
- USER.md: who the user is (identity, preferences, circumstances).
- memory/MEMORY.md: durable project facts and decisions.

Compare the new history entries and daily-note bullets with the current files. Report only information that
is new or that conflicts with the files: one atomic fact per line, in the form

[USER] fact
[SOUL] fact
[MEMORY] fact

State a correction as a correction ("correction: the user's cat is named Luna, not Lina").
Ignore small talk, one-off tasks and facts that will not matter next week. Do not repeat what the files
already say. If nothing needs updating, answer exactly:

[SKIP]

Answer with those lines only, no other text."""

EDIT_SYSTEM = """\
You edit an assistant's long-term memory files with the tools read_file and edit_file. Paths are relative
to the workspace and must be one of: SOUL.md, USER.md, memory/MEMORY.md.

Apply each finding to the file its tag names ([USER] -> USER.md, [SOUL] -> SOUL.md, [MEMORY] ->
memory/MEMORY.md):
- Apply corrections in place: replace the wrong fact, do not add a second, contradicting one.
- Drop facts that were only ever ephemeral and are now stale.
- Strip [mark] prefixes such as [durable] or [correction]; write plain facts.
- Keep every file small and sectioned: `##` sections of `- ` bullets. Add a bullet to the fitting
  section; create a section only when none fits. Never remove a whole section or rewrite a file.
- No dates, timestamps or bare URLs in memory/MEMORY.md: state the lasting fact itself.
- Each file has a size cap (it is put whole into every prompt); an edit past it is refused with the reason.
- edit_file replaces exact text: each old_text must occur exactly once in the file. Copy it from the file.

When every finding is applied (or nothing needs changing), reply with a one-line summary and no tool call."""


CONDENSE_SYSTEM = """\
You keep an assistant's long-term memory files small, with the tools read_file and edit_file. Paths are
relative to the workspace and must be one of: SOUL.md, USER.md, memory/MEMORY.md.

The files named in the request are over their size caps. The agent puts them whole into every prompt, so
every character over a cap is paid on every turn. Shorten them to within their caps without losing a fact:
- Merge bullets that say the same thing; fold closely related bullets into one.
- Shorten wordy bullets to the fact itself.
- Drop a fact only when a later bullet corrects or replaces it, or when it was ephemeral and is now stale.
- Keep every `##` section; a section may shrink, never disappear.
- Every edit must make its file shorter; an edit that does not is refused.
- edit_file replaces exact text: each old_text must occur exactly once in the file. Copy it from the file.
Aim about a tenth under each cap, so that new facts fit.

When the files are within their caps, reply with a one-line summary and no tool call."""


def format_file(path: str, text: str | None, problem: str | None = None) -> str:
    """One memory file as a prompt section."""
    if text is None:
        body = f"(not available: {problem})" if problem else "(missing)"
    elif len(text) > FILE_SHOWN_CHARS:
        body = text[:FILE_SHOWN_CHARS] + CUT_MARK
    else:
        body = text or "(empty)"
    return f"### {path}\n{body}"


def format_entry(entry: HistoryEntry) -> str:
    """One history entry as a prompt section."""
    content = entry.content
    if len(content) > ENTRY_SHOWN_CHARS:
        content = content[:ENTRY_SHOWN_CHARS] + CUT_MARK
    session = f" | {entry.session_key}" if entry.session_key else ""
    return f"[entry {entry.cursor} | {entry.timestamp}{session}]\n{content}"


def format_note(item: NoteItem) -> str:
    """New bullets of one daily note as a prompt section, under their note's section headings."""
    lines, section = [f"[daily note {item.day.isoformat()}]"], None
    for bullet in item.bullets:
        if bullet.section != section:
            section = bullet.section
            lines.append(f"{section}:")
        lines.append(f"- {bullet.text}")
    return "\n".join(lines)


def analysis_request(files: Iterable[str], entries: list[HistoryEntry], notes: list[NoteItem]) -> str:
    """The phase 1 user message: the current files, then the new history entries and note bullets."""
    parts = ["## Current memory files", *files]
    if entries:
        parts += ["## New history entries", *(format_entry(entry) for entry in entries)]
    if notes:
        parts += ["## New daily-note bullets", *(format_note(item) for item in notes)]
    return "\n\n".join(parts)


def condense_request(overruns: Iterable[str], files: Iterable[str]) -> str:
    """The condensing pass's user message: what is over which cap, with the files as they are."""
    over = "\n".join(f"- {line}" for line in overruns)
    return "\n\n".join(["## Over their caps", over, "## Current memory files", *files])


def edit_request(findings: Iterable[str], files: Iterable[str]) -> str:
    """The phase 2 user message: the findings to apply, with the files as they are now."""
    return "\n\n".join(["## Findings to apply", "\n".join(findings), "## Current memory files", *files])


def parse_analysis(text: str) -> tuple[list[str], bool]:
    """([TAG] fact lines, whether [SKIP] was said); any other line is ignored and logged."""
    findings, skipped = [], False
    for line in THINK_BLOCK.sub("", text).splitlines():
        line = line.strip()
        if not line:
            continue
        match = FINDING.match(line)
        if match:
            findings.append(f"[{match.group(1)}] {match.group(2).strip()}")
        elif line == SKIP_LINE:
            skipped = True
        else:
            logger.info("dream analysis: ignoring a line that is not a finding: {!r}", line[:120])
    return findings, skipped
