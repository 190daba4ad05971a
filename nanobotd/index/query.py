"""Turn any user query string into a safe FTS5 match expression.

Users and agents type free text ("what did we decide about C++ (NEAR the deadline)?"), so the text is
never handed to FTS5 as syntax: words are extracted, stopwords dropped, each word quoted, and the words
joined with OR (implicit AND would lose every unit that misses one word). Dates named in the query
("13 October 2023", "2023-10-13", "yesterday") also become phrases matched against the `dates` column,
which holds the date words of every dated unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

MAX_TERMS = 40
WORD = re.compile(r"\w+", re.UNICODE)
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
MONTH_ALTERNATION = "|".join([name for name in MONTHS] + [name[:3] for name in MONTHS] + ["sept"])
DAY_MONTH_YEAR = re.compile(
    rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({MONTH_ALTERNATION})\.?,?\s+(\d{{4}})\b", re.I)
MONTH_DAY_YEAR = re.compile(rf"\b({MONTH_ALTERNATION})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
MONTH_YEAR = re.compile(rf"\b({MONTH_ALTERNATION})\.?,?\s+(\d{{4}})\b", re.I)
DAYS_AGO = re.compile(r"\b(\d{1,3})\s+days?\s+ago\b", re.I)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
LAST_WEEKDAY = re.compile(r"\blast\s+(" + "|".join(WEEKDAYS) + r")\b", re.I)
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
""".split())


@dataclass(frozen=True)
class Query:
    """A parsed query: the words searched, the date phrases, and their FTS5 clauses (none = no search)."""

    terms: list[str] = field(default_factory=list)
    date_phrases: list[str] = field(default_factory=list)
    clauses: list[str] = field(default_factory=list)

    @property
    def expression(self) -> str:
        """All clauses OR-ed: the FTS5 MATCH expression."""
        return " OR ".join(self.clauses)


def parse_query(text: str, now: datetime | None = None) -> Query:
    """Words (stopwords dropped unless nothing else is left) and dates of *text*, as a safe expression."""
    text = text or ""
    words = [word.lower() for word in WORD.findall(text)]
    terms = _unique(word for word in words if word not in STOPWORDS and word != "_")
    if MAY_MONTH.search(text):
        terms.append("may")
    if not terms:
        terms = _unique(word for word in words if word != "_")
    terms = [term for term in terms if len(term) <= 64][:MAX_TERMS]
    phrases = [date_phrase(day) for day in named_dates(text, now)]
    phrases += [month_phrase(month, year) for month, year in named_months(text)]
    phrases = _unique(phrases)
    clauses = [quote(term) for term in terms] + [f"dates : {quote(phrase)}" for phrase in phrases]
    return Query(terms, phrases, clauses)


def quote(term: str) -> str:
    """An FTS5 string literal: whatever it holds is matched as words, never parsed as syntax."""
    return '"' + term.replace('"', '""') + '"'


def date_words(moment: date | datetime | None) -> str:
    """The words stored in the `dates` column for a unit dated *moment* ("Friday 13 October 2023")."""
    if moment is None:
        return ""
    return f"{WEEKDAYS[moment.weekday()].title()} {moment.day} {MONTHS[moment.month - 1].title()} {moment.year}"


def date_phrase(day: date) -> str:
    """The phrase that matches the `dates` column of units from *day*."""
    return f"{day.day} {MONTHS[day.month - 1]} {day.year}"


def month_phrase(month: int, year: int) -> str:
    """The phrase that matches the `dates` column of units from a month."""
    return f"{MONTHS[month - 1]} {year}"


def named_dates(text: str, now: datetime | None = None) -> list[date]:
    """Calendar days named in *text*: absolute dates always, relative ones ("yesterday") given *now*."""
    days: list[date] = []
    for match in DAY_MONTH_YEAR.finditer(text):
        days += _valid_day(match.group(3), _month_number(match.group(2)), match.group(1))
    for match in MONTH_DAY_YEAR.finditer(text):
        days += _valid_day(match.group(3), _month_number(match.group(1)), match.group(2))
    for match in ISO_DATE.finditer(text):
        days += _valid_day(match.group(1), int(match.group(2)), match.group(3))
    if now is not None:
        days += _relative_days(text.lower(), now.date())
    return days


def named_months(text: str) -> list[tuple[int, int]]:
    """(month, year) pairs named without a day ("in May 2023")."""
    months = []
    for match in MONTH_YEAR.finditer(text):
        months.append((_month_number(match.group(1)), int(match.group(2))))
    return months


def _relative_days(lowered: str, today: date) -> list[date]:
    days = []
    if re.search(r"\btoday\b", lowered):
        days.append(today)
    if re.search(r"\byesterday\b", lowered):
        days.append(today - timedelta(days=1))
    if re.search(r"\blast\s+week\b", lowered):
        days += [today - timedelta(days=offset) for offset in range(1, 8)]
    for match in DAYS_AGO.finditer(lowered):
        days.append(today - timedelta(days=int(match.group(1))))
    for match in LAST_WEEKDAY.finditer(lowered):
        back = (today.weekday() - WEEKDAYS.index(match.group(1))) % 7 or 7
        days.append(today - timedelta(days=back))
    return days


def _month_number(name: str) -> int:
    prefix = name.lower()[:3]
    return next(number for number, month in enumerate(MONTHS, start=1) if month.startswith(prefix))


def _valid_day(year: str, month: int, day: str) -> list[date]:
    try:
        return [date(int(year), month, int(day))]
    except ValueError:
        return []


def _unique(items) -> list:
    seen: dict = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)
