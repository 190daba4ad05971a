"""Turn any user query string into a safe FTS5 match expression.

Free text is never FTS5 syntax: words are extracted, stopwords dropped, each quoted, joined with OR (implicit AND
loses every unit missing one word). Named dates ("yesterday", "2023-10-13", "between May 2 and May 5 2023") become
day and month keys matched in the `dates` column (index.timeintent); a query naming only a time searches only that
time: a filter, not a boost."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from nanobotd.index.timeintent import day_key, find_time, month_key

MAX_TERMS = 40
MAX_DATE_PHRASES = 62
WORD = re.compile(r"\w+", re.UNICODE)
# "may" is a stopword (the modal verb) unless the text uses it as the month.
MAY_MONTH = re.compile(r"\b(?:in|of|since|during|until|before|after|early|late|mid|last|this|next)\s+may\b|"
                       r"\bmay\s+\d|\d(?:st|nd|rd|th)?\s+may\b", re.I)

# Function words and question framing: they carry no topic, and in OR mode they would pull in
# every unit that happens to contain them.
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can cannot could did do does doing down during each else ever few for from further get
got had has have having he her here hers herself him himself his how i if in into is it its itself just
let me more most my myself no nor not now of off on once only or other ought our ours ourselves out over own
same shall she should so some such than that the their theirs them themselves then there these they this
those through to too under until up upon very was we were what when where which while who whom whose why
will with would you your yours yourself yourselves s t d ll m re ve don didn doesn isn wasn aren weren won
may might must
please tell remind know recall remember thing things kind type
happen happened happening discuss discussed talk talked say said mention mentioned
""".split())


@dataclass(frozen=True)
class Query:
    """A parsed query: the words searched, the dates named, and their FTS5 clauses (none = no search)."""

    terms: list[str] = field(default_factory=list)
    date_keys: list[str] = field(default_factory=list)  # day and month keys (index.timeintent), for `dates`
    clauses: list[str] = field(default_factory=list)
    time_only: bool = False  # a time and no word worth searching: only that time is searched


def parse_query(text: str, now: datetime | None = None) -> Query:
    """Words (stopwords and date expressions dropped) and dates of *text*, as a safe expression."""
    text = text or ""
    intent = find_time(text, now)
    found = [(match.group().lower(), intent.covers(match.start(), match.end())) for match in WORD.finditer(text)]
    words = [word for word, _ in found]
    terms = list(dict.fromkeys(word for word, dated in found if not dated and word not in STOPWORDS and word != "_"))
    named_may = any(month == 5 for month, _ in intent.months) or any(day.month == 5 for day in intent.days)
    if MAY_MONTH.search(text) and not named_may and "may" not in terms:
        terms.append("may")
    keys = list(dict.fromkeys([day_key(day) for day in intent.days] +
                              [month_key(month, year) for month, year in intent.months]))[:MAX_DATE_PHRASES]
    if not terms and not keys:
        terms = list(dict.fromkeys(word for word in words if word != "_"))
    terms = [term for term in terms if len(term) <= 64][:MAX_TERMS]
    clauses = [quote(term) for term in terms] + [f"dates : {quote(key)}" for key in keys]
    return Query(terms, keys, clauses, time_only=bool(keys) and not terms)


def quote(term: str) -> str:
    """An FTS5 string literal: whatever it holds is matched as words, never parsed as syntax."""
    return '"' + term.replace('"', '""') + '"'
