"""The archive prompt and the parsing of its answer into history-entry content."""

from __future__ import annotations

import re

from nanobotd.memory.history import THINK_BLOCK

NOTHING = "(nothing)"
FACT_LINE = re.compile(r"^\s*[-*]\s*\[(permanent|durable|ephemeral|correction|skip)\]\s*(.+?)\s*$", re.IGNORECASE)

ARCHIVE_SYSTEM_PROMPT = """You archive an assistant's conversation into long-term memory.
Read the transcript and write down what is worth remembering later, as atomic fact lines, one per line:

- [mark] fact

Marks:
- permanent: stable facts about the user, their world and their standing preferences
- durable: decisions, project facts and constraints that stay true for weeks or months
- ephemeral: state that matters only for the next days (plans, temporary problems)
- correction: the user corrected an earlier fact or preference; state the corrected fact in full

Rules:
- Give priority to corrections and preferences the user expressed.
- One fact per line, self-contained, with names, numbers and dates spelled out; no pronouns without referents.
- Skip greetings, filler, acknowledgements and small talk.
- Skip what the repository or git history already records (code diffs, file contents, command output).
- Do not invent anything that is not in the transcript.
- If nothing is worth keeping, answer exactly: (nothing)
Answer with the fact lines only."""


def archive_messages(transcript_text: str, session_key: str) -> list[dict]:
    """The chat messages of one archive request."""
    return [
        {"role": "system", "content": ARCHIVE_SYSTEM_PROMPT},
        {"role": "user", "content": f"Session: {session_key}\n\nTranscript:\n{transcript_text}"},
    ]


def parse_summary(content: str, max_chars: int) -> str | None:
    """Fact lines from the model's answer; NOTHING when it kept nothing; None when it is unusable."""
    text = THINK_BLOCK.sub("", content or "")
    text = text.strip()
    if not text:
        return None
    if text.strip("`'\" .").lower() == NOTHING.strip("()") or text.lower().startswith(NOTHING):
        return NOTHING
    facts = []
    for line in text.splitlines():
        match = FACT_LINE.match(line)
        if match is None:
            continue
        mark, fact = match.group(1).lower(), match.group(2)
        if mark == "skip":
            continue
        facts.append(f"- [{mark}] {fact}")
    if not facts:
        return None
    kept, size = [], 0
    for fact in facts:
        if size + len(fact) + 1 > max_chars:
            break
        kept.append(fact)
        size += len(fact) + 1
    return "\n".join(kept) if kept else None
