"""From ranked FTS rows to search hits: trim overlapping session windows, pick a snippet.
Windows overlap (stride < window), so each message is shown once and later windows are trimmed to unseen messages,
keeping the top hits distinct. Hits stay in bm25 order across sources: rank fusion lost recall (bench_locomo.py)."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from nanobotd.index.ftsdb import MatchRow
from nanobotd.index.hit import SearchHit
from nanobotd.tuning import HIT_WORDS, MIN_HIT_WORDS

SNIPPET_CHARS = 240
SNIPPET_LEAD = 60
# The agent reads every word of a hit: a hit takes at most 1.5 times an even share of the words left. A
# session window longer than its share shows its best-matching message with the neighbours that fit, a
# message longer than that is cut around its matches.
HIT_LEAD_WORDS = 25


def build_hits(rows: list[tuple[MatchRow, float]], terms: list[str], limit: int,
               display_path: Callable[[str], str], min_score: float = 0.0) -> list[SearchHit]:
    """The first *limit* distinct hits of scored *rows* (best first) scoring at least *min_score*,
    each message shown at most once."""
    shown: dict[str, set[int]] = defaultdict(set)
    hits: list[SearchHit] = []
    pattern = highlighter(terms)
    display_path = functools.lru_cache(maxsize=None)(display_path)
    words_left = HIT_WORDS * limit
    for row, score in rows:
        if len(hits) >= limit:
            break
        if score < min_score:
            continue
        row = replace(row, score=round(score, 4))
        if row.source == "session" and row.parts:
            still = limit - len(hits)
            share = max(MIN_HIT_WORDS, min(words_left * 3 // 2 // still, words_left - MIN_HIT_WORDS * (still - 1)))
            hit = _session_hit(row, pattern, shown[row.path], display_path, share)
        else:
            hit = _file_hit(row, pattern, display_path)
        if hit is not None:
            hits.append(hit)
            words_left -= len(hit.text.split())
    return hits


def _file_hit(row: MatchRow, pattern: tuple[str, ...], display_path: Callable[[str], str]) -> SearchHit:
    return SearchHit(
        source=row.source, path=display_path(row.path), snippet=make_snippet(row.body, pattern),
        score=row.score, text=row.body, when=row.when, line_start=row.first, line_end=row.last,
        session_key=row.session_key, extra={"unit_id": row.unit_id},
    )


def _session_hit(row: MatchRow, pattern: tuple[str, ...], shown: set[int],
                 display_path: Callable[[str], str], max_words: int) -> SearchHit | None:
    try:
        parts = [(int(part[0]), int(part[1]), str(part[2])) for part in json.loads(row.parts)]
    except (ValueError, TypeError, IndexError):
        parts = []
    if not parts:
        return None
    fresh = _longest_fresh_run(parts, shown)
    if fresh is None:
        return None
    first, last = fresh

    def span(first: int, last: int) -> str:
        end = parts[last + 1][1] - 1 if last + 1 < len(parts) else len(row.body)
        return row.body[parts[first][1]:end]

    text = span(first, last)
    if len(text.split()) > max_words:
        first, last = _best_run(first, last, lambda index: span(index, index), pattern, max_words)
        text = span(first, last)
        if first == last and len(text.split()) > max_words:
            text = _around_matches(text, pattern, max_words)
    shown.update(part[0] for part in parts[first:last + 1])
    return SearchHit(
        source="session", path=display_path(row.path), snippet=make_snippet(text, pattern),
        score=row.score, text=text, when=parts[first][2] or row.when,
        session_key=row.session_key, message_start=parts[first][0], message_end=parts[last][0],
        extra={"unit_id": row.unit_id, "trimmed": first > 0 or last < len(parts) - 1},
    )


def _best_run(first: int, last: int, message: Callable[[int], str], pattern: tuple[str, ...],
              max_words: int) -> tuple[int, int]:
    """The message of first..last matching most query words, with as many neighbours (the next one first:
    an answer follows its question) as fit in *max_words*."""
    best = max(range(first, last + 1), key=lambda index: _word_starts(message(index).lower(), pattern)[0])
    words = {index: len(message(index).split()) for index in range(first, last + 1)}
    low = high = best
    used = words[best]
    grew = True
    while grew:
        grew = False
        for index in (high + 1, low - 1):
            if first <= index <= last and used + words[index] <= max_words:
                used += words[index]
                low, high = min(low, index), max(high, index)
                grew = True
    return low, high


def _around_matches(text: str, pattern: tuple[str, ...], max_words: int) -> str:
    """*text* cut to *max_words* words, starting a little before its first query word (its head if none)."""
    words = text.split(" ")
    if len(words) <= max_words:
        return text
    max_words -= 3  # the speaker's label and two ellipses
    hit_at = next((index for index, word in enumerate(words)
                   if _word_starts(word.lower().lstrip("\"'(*[\n"), pattern)[0]), 0)
    start = max(0, min(hit_at - HIT_LEAD_WORDS, len(words) - max_words))
    label = text[:text.find(": ") + 2] if start and 0 < text.find(": ") < 40 else ""
    return (label + ("… " if start else "") + " ".join(words[start:start + max_words])
            + (" …" if start + max_words < len(words) else ""))


def _longest_fresh_run(parts: list[tuple[int, int, str]], shown: set[int]) -> tuple[int, int] | None:
    """(first, last) indices of the longest run of parts not shown yet (the earliest on a tie)."""
    best: tuple[int, int] | None = None
    run_start = None
    for index, part in enumerate(parts):
        if part[0] in shown:
            run_start = None
            continue
        run_start = index if run_start is None else run_start
        if best is None or index - run_start > best[1] - best[0]:
            best = (run_start, index)
    return best


def highlighter(terms: list[str]) -> tuple[str, ...]:
    """The crude stems that find the query's words in text, longest first (none for a query without words)."""
    return tuple(sorted({_stem(term.lower()) for term in terms}, key=len, reverse=True))


def make_snippet(text: str, pattern: tuple[str, ...]) -> str:
    """The line of *text* matching most query words, cut to SNIPPET_CHARS around its first match."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    best_line, best_score, best_at = lines[0], 0, 0
    for line in lines if pattern else ():
        matched, first = _word_starts(line.lower(), pattern)
        if matched > best_score:
            best_line, best_score, best_at = line, matched, first
    start = max(0, best_at - SNIPPET_LEAD) if len(best_line) > SNIPPET_CHARS else 0
    snippet = best_line[start:start + SNIPPET_CHARS]
    return ("…" if start else "") + snippet + ("…" if start + SNIPPET_CHARS < len(best_line) else "")


def _word_starts(lowered: str, stems: tuple[str, ...]) -> tuple[int, int]:
    """How many of *stems* begin a word of *lowered*, and where the first such word is."""
    matched, first = 0, len(lowered)
    for stem in stems:
        at = lowered.find(stem)
        while at > 0 and (lowered[at - 1].isalnum() or lowered[at - 1] == "_"):
            at = lowered.find(stem, at + 1)
        if at >= 0:
            matched += 1
            first = min(first, at)
    return matched, first


def _stem(term: str) -> str:
    """A crude stem for highlighting only ("painting" and "painted" both start with "paint")."""
    return term if len(term) <= 4 else term[: max(4, len(term) - 3)]
