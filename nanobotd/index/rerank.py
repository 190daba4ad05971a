"""Second-stage ranking of what FTS5 found: the unit as a whole, its best part, and a score that means something.

Each candidate is scored against the whole query: the unit's BM25 fused with its best part's (a message, a line),
both scaled to the best candidate, so one turn answering beats four spreading the words. Ranks as well as bm25() on
LoCoMo (scripts/bench_locomo.py) and holds when the expression dropped words. The score shown is absolute, in [0, 1]:
the fused score times how much of the query the hit matches, weighted by rarity; min_score filters on it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from nanobotd.index.ftsdb import MatchRow
from nanobotd.index.stems import TOKEN, Stemmer
from nanobotd.tuning import COVERAGE_SHARE, PART_WEIGHT, QUESTION_WEIGHT, SESSION_PRIOR

K1 = 1.2
B = 0.75
MIN_PREFIX_CHARS = 3
# The rest of a word after a prefix found in it (unicode61's word characters: letters and digits).
WORD_REST = re.compile(r"[^\W_]*")


@dataclass(frozen=True)
class QueryWeights:
    """The query's stems with their IDF, and the weight of its date phrases (matched as one)."""

    stems: dict[str, float]
    dates_weight: float = 0.0
    date_keys: tuple[str, ...] = ()

    def dated(self, dates: str) -> bool:
        """True when a unit's `dates` column holds the key of one of the days or months the query names."""
        padded = f" {dates} "
        return any(f" {key} " in padded for key in self.date_keys)

    @property
    def total(self) -> float:
        return sum(self.stems.values()) + self.dates_weight


def idf(units: int, count: int) -> float:
    """BM25's IDF in its always-positive form (a word in most units weighs little, never less than zero)."""
    return math.log(1 + (max(units, count) - count + 0.5) / (count + 0.5))


def query_weights(stems: list[str], counts: list[int], units: int, date_keys: list[str],
                  date_count: int) -> QueryWeights:
    """IDF per distinct stem (from how many units hold it) and of the date phrases, if any."""
    weights: dict[str, float] = {}
    for stem, count in zip(stems, counts, strict=True):
        if stem and stem not in weights:
            weights[stem] = idf(units, count)
    dates_weight = idf(units, date_count) if date_keys else 0.0
    return QueryWeights(weights, dates_weight, tuple(date_keys))


def rerank(rows: list[MatchRow], weights: QueryWeights, stemmer: Stemmer,
           parts_of: Callable[[MatchRow], list[tuple[int, int]]]) -> list[tuple[MatchRow, float]]:
    """(row, score in [0, 1]) best first; *parts_of* gives the (start, end) character span of each part."""
    if not rows or weights.total <= 0:
        return [(row, 0.0) for row in rows]
    scored = _scored(rows, weights, stemmer, parts_of)
    if scored[0][1] <= 0:
        # Parts leave out the speaker's label, so a query whose only word is a name ("What did Caroline
        # say?") matched nothing in them: then the label counts, each unit read as one part.
        scored = _scored(rows, weights, stemmer, lambda row: [(0, len(row.body))])
    return scored


def _scored(rows: list[MatchRow], weights: QueryWeights, stemmer: Stemmer,
            parts_of: Callable[[MatchRow], list[tuple[int, int]]]) -> list[tuple[MatchRow, float]]:
    prefixes = _prefixes(weights)
    found = [[_candidate_words(row.body[start:end], prefixes) for start, end in parts_of(row) or [(0, len(row.body))]]
             for row in rows]
    distinct = list({word for parts in found for words, _, _ in parts for word in words})
    stem_of = {word: stem for word, stem in zip(distinct, stemmer.stems(distinct), strict=True)
               if stem in weights.stems}
    analysed = [_analyse(row, parts, stem_of, weights) for row, parts in zip(rows, found, strict=True)]
    average = sum(length for _, _, length, _ in analysed) / len(analysed) or 1.0
    part_lengths = [length for _, parts, _, _ in analysed for _, length in parts]
    part_average = sum(part_lengths) / max(len(part_lengths), 1) or 1.0
    unit_scores = [_bm25(counts, length, average, weights) for counts, _, length, _ in analysed]
    part_scores = [max((_bm25(counts, length, part_average, weights) for counts, length in parts if counts),
                       default=0.0)
                   for _, parts, _, _ in analysed]
    top_unit, top_part = max(unit_scores) or 1.0, max(part_scores) or 1.0
    scored = []
    for row, (_, _, _, matched), unit, part in zip(rows, analysed, unit_scores, part_scores, strict=True):
        fused = (unit / top_unit + PART_WEIGHT * part / top_part) / (1 + PART_WEIGHT)
        coverage = matched / weights.total
        prior = SESSION_PRIOR if row.source == "session" else 1.0
        scored.append((row, prior * fused * (1 - COVERAGE_SHARE + COVERAGE_SHARE * coverage)))
    scored.sort(key=lambda item: -item[1])
    return scored


def _prefixes(weights: QueryWeights) -> tuple[str, ...]:
    """What a word must start with to stem to a query stem, so only those are stemmed. A Porter stem is a prefix of its
    word but for a final y turned i, hence the stem less its last letter."""
    return tuple(sorted({stem[:max(len(stem) - 1, min(len(stem), MIN_PREFIX_CHARS))] for stem in weights.stems},
                        key=len, reverse=True))


def find_words(lowered: str, prefixes: tuple[str, ...]) -> list[str]:
    """Each occurrence of a whole word of lowercased text that starts with one of *prefixes*. str.find, not a
    regular expression: compiling one per query cost more than the search itself."""
    found: dict[int, str] = {}
    for prefix in prefixes:
        at = lowered.find(prefix)
        while at >= 0:
            if at not in found and (at == 0 or not lowered[at - 1].isalnum()):
                end = WORD_REST.match(lowered, at + len(prefix)).end()
                found[at] = lowered[at:end]
            at = lowered.find(prefix, at + 1)
    return list(found.values())


def _candidate_words(text: str, prefixes: tuple[str, ...]) -> tuple[list[str], int, float]:
    """The lowercased words of *text* that may match (non-ASCII ones always: diacritics fold), its word count (split on
    whitespace: close enough for BM25), and what one match in it counts (less in a question)."""
    lowered = text.lower()
    found = find_words(lowered, prefixes) if prefixes else []
    if not text.isascii():
        found += [word for word in TOKEN.findall(lowered) if not word.isascii()]
    return found, len(text.split()), QUESTION_WEIGHT if text.rstrip().endswith("?") else 1.0


def _analyse(row: MatchRow, parts: list[tuple[list[str], int, float]], stem_of: dict[str, str],
             weights: QueryWeights) -> tuple[dict, list[tuple[dict, int]], int, float]:
    """Query-stem counts of the unit and of each part (a question's count less), the unit's length, and
    the query weight it matches."""
    counted = []
    total: dict[str, float] = {}
    length = 0
    for words, size, each in parts:
        counts: dict[str, float] = {}
        for word in words:
            stem = stem_of.get(word)
            if stem is not None:
                counts[stem] = counts.get(stem, 0) + each
                total[stem] = total.get(stem, 0) + each
        counted.append((counts, size))
        length += size
    matched = sum(weights.stems[stem] for stem in total)
    if weights.dates_weight and weights.dated(row.dates):
        matched += weights.dates_weight
        total["\x00dates"] = 1
    return total, counted, length, matched


def _bm25(counts: dict, length: int, average: float, weights: QueryWeights) -> float:
    norm = K1 * (1 - B + B * length / average)
    score = sum(weights.stems[stem] * count * (K1 + 1) / (count + norm)
                for stem, count in counts.items() if stem in weights.stems)
    if counts.get("\x00dates"):
        score += weights.dates_weight
    return score
