"""Expiring notes into history entries: an LLM summary per batch that fits, [RAW] transcripts otherwise. The notes are
deleted next, so nothing may be lost: too big, offline or failing LLM all mean [RAW], split at line ends."""

from __future__ import annotations

from pathlib import Path

from nanobotd.llm.client import LLMClient
from nanobotd.llm.failures import LLMError
from nanobotd.llm.reply import UsageMeter
from nanobotd.memory import history
from nanobotd.memory.transcript import PendingMessage, packed_entries, raw_entries
from nanobotd.tokens import count_tokens, encoding_name_for
from nanobotd.tuning import INPUT_SHARE

SUMMARY_MAX_TOKENS = 4096
NOTHING = "(nothing)"
RAW_ENTRY_MARGIN = 400

SUMMARY_PROMPT = f"""You compress an agent's expired daily notes into its long-term history; the notes are \
deleted afterwards. Keep every fact that could matter later (decisions, preferences, constraints, outcomes of \
work, questions left open) and drop chatter. Answer only with fact lines, one per line, each written as \
"- [mark] fact" where mark is one of permanent, durable, ephemeral, correction; give the date a fact is from \
when it matters. If nothing is worth keeping, answer exactly {NOTHING}."""


async def summarise_notes(notes: list[tuple[str, bytes]], *, llm: LLMClient, meter: UsageMeter,
                          raw_max_chars: int) -> tuple[list[str], dict]:
    """History entry contents for expiring notes: one LLM summary per batch that fits the context window,
    and [RAW] entries (split, never cut) when offline, when the LLM fails, or for a note too big to send."""
    texts = [(path, data.decode("utf-8", errors="replace")) for path, data in notes]
    summary = {"notes": len(texts), "llm_batches": 0, "raw_notes": 0, "reason": ""}
    if llm.offline:
        summary.update(raw_notes=len(texts), reason="offline")
        return raw_note_entries(texts, raw_max_chars), summary
    encoding = encoding_name_for(llm.settings.model)
    budget = int(llm.settings.context_window * INPUT_SHARE) - count_tokens(SUMMARY_PROMPT, encoding) - 64
    contents: list[str] = []
    for batch, fits in note_batches(texts, budget, encoding):
        facts = await _summarise_batch(batch, llm, meter, summary) if fits else None
        if not fits:
            summary["reason"] = "a note is too large to summarise"
        if facts is None:
            contents.extend(raw_note_entries(batch, raw_max_chars))
            summary["raw_notes"] += len(batch)
        elif facts != NOTHING:
            contents.extend(summary_entries(batch, facts))
    return contents, summary


async def _summarise_batch(batch: list[tuple[str, str]], llm: LLMClient, meter: UsageMeter,
                           summary: dict) -> str | None:
    body = "\n\n".join(f"=== {path} ===\n{text}" for path, text in batch)
    request = [{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": body}]
    try:
        reply = await llm.complete(request, max_tokens=SUMMARY_MAX_TOKENS, temperature=0.0)
    except LLMError as exc:
        meter.add_error(exc)
        summary["reason"] = f"LLM failed: {exc}"
        return None
    meter.add(reply)
    facts = history.THINK_BLOCK.sub("", reply.content).strip()
    if not facts:
        summary["reason"] = "LLM gave an empty summary"
        return None
    summary["llm_batches"] += 1
    return facts


def note_batches(texts: list[tuple[str, str]], budget: int, encoding: str) -> list[tuple[list, bool]]:
    """Consecutive notes grouped to fit *budget* tokens, in their order; a note over the budget alone is
    (note, False)."""
    batches: list[tuple[list, bool]] = []
    current: list[tuple[str, str]] = []
    used = 0
    for path, text in texts:
        cost = count_tokens(text, encoding) + 16
        if current and used + cost > budget:  # also before a note over the budget: history stays in date order
            batches.append((current, True))
            current, used = [], 0
        if cost > budget:
            batches.append(([(path, text)], False))
            continue
        current.append((path, text))
        used += cost
    if current:
        batches.append((current, True))
    return batches


def summary_entries(batch: list[tuple[str, str]], facts: str) -> list[str]:
    """The summary of a batch as history entries, each under the hard cap."""
    days = [Path(path).stem for path, _ in batch]
    header = f"Archived daily notes {days[0]} to {days[-1]} ({len(days)} notes), summarised before deletion:"
    room = history.ENTRY_HARD_CAP - len(header) - 64
    lines = [line[start:start + room] for line in facts.splitlines() for start in range(0, max(len(line), 1), room)]
    return packed_entries(lines, room, lambda _: header)


def raw_note_entries(batch: list[tuple[str, str]], max_chars: int) -> list[str]:
    """Notes as [RAW] entries in nanobot's transcript format, one "message" per note, split and never cut."""
    messages = []
    for path, text in batch:
        # Split long notes at line ends ourselves, so a fact is never cut in two across entries.
        pieces = line_chunks(text, max_chars - RAW_ENTRY_MARGIN)
        for number, piece in enumerate(pieces, start=1):
            label = path if len(pieces) == 1 else f"{path} (part {number} of {len(pieces)})"
            messages.append(PendingMessage("", "note", Path(path).stem, f"{label}\n{piece}", 0, {}))
    return raw_entries(messages, max_chars)


def line_chunks(text: str, size: int) -> list[str]:
    """*text* cut at line ends into pieces of at most *size* chars (a longer single line is its own piece)."""
    pieces: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        if current and len(current) + len(line) > size:
            pieces.append(current)
            current = ""
        current += line
    if current or not pieces:
        pieces.append(current)
    return pieces
