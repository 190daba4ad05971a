"""The time a query asks about: named dates, months, ranges and relative days, with where they are in the text.
Days become keys ("d20231013", month "m202310") matched in the index's `dates` column, and their words are not
searched: a phrase like "13 october 2023" would walk "october" and "2023", in nearly every unit of a year of history."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTH_ALTERNATION = "|".join(list(MONTHS) + [name[:3] for name in MONTHS] + ["sept"])
ORDINAL = r"(?:st|nd|rd|th)?"
DAY_MONTH_YEAR = re.compile(
    rf"\b(\d{{1,2}}){ORDINAL}\s+(?:of\s+)?({MONTH_ALTERNATION})\.?,?\s+(\d{{4}})\b", re.I)
MONTH_DAY_YEAR = re.compile(rf"\b({MONTH_ALTERNATION})\.?\s+(\d{{1,2}}){ORDINAL},?\s+(\d{{4}})\b", re.I)
ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
# 31.12.2023: day first, as it is written where dots separate dates.
DOTTED_DATE = re.compile(r"\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b")
# A day and month without a year ("on the 10th of February", "Feb 10th"): the year nearest to when it was said.
DAY_MONTH = re.compile(rf"\b(\d{{1,2}}){ORDINAL}\s+(?:of\s+)?({MONTH_ALTERNATION})\b\.?", re.I)
MONTH_DAY = re.compile(rf"\b({MONTH_ALTERNATION})\.?\s+(\d{{1,2}}){ORDINAL}\b(?!:)", re.I)
FORWARD = re.compile(r"\b(tomorrow|(?:next|this|coming)\s+(?:" + "|".join(WEEKDAYS) + r"))\b", re.I)
IN_DAYS = re.compile(r"\bin\s+(\d{1,3})\s+(days?|weeks?)\b", re.I)
# A day is named with a digit or a weekday (or "today", "yesterday", "tomorrow", "last week"): only the text
# around those is read with the patterns above, so the cost follows the digits, not the length of the text.
# Reading every message with each pattern made building an index of 100,000 entries four times slower.
DIGITS = re.compile(r"\d+")
STAMP = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})(?:[t ]\d{1,2}:\d{2}(?::\d{2})?)?\b")
AROUND_CHARS = 24
WEEKDAY_STEMS = tuple(day[:-3] for day in WEEKDAYS)
# Every pattern but the dotted date needs one of these near a digit or weekday.
DATE_HINTS = (*(name[:3] for name in MONTHS), "day", "week", "ago")
MAX_EVENT_DAYS = 8
MONTH_YEAR = re.compile(rf"\b({MONTH_ALTERNATION})\.?,?\s+(\d{{4}})\b", re.I)
# The first end of a range may leave its year to the second: "between August 11 and August 15 2023".
RANGE_START = re.compile(rf"\b(?:between|from)\s+(?:({MONTH_ALTERNATION})\.?\s+(\d{{1,2}}){ORDINAL}|"
                         rf"(\d{{1,2}}){ORDINAL}\s+(?:of\s+)?({MONTH_ALTERNATION}))\.?,?\s+(?:and|to|until)\s+", re.I)
DAYS_AGO = re.compile(r"\b(\d{1,3})\s+(days?|weeks?)\s+ago\b", re.I)
LAST_WEEKDAY = re.compile(r"\blast\s+(" + "|".join(WEEKDAYS) + r")\b", re.I)
RELATIVE = re.compile(r"\b(today|yesterday|last\s+night|(?:last|this|past)\s+(?:week|month))\b", re.I)
MAX_RANGE_DAYS = 62


@dataclass
class TimeIntent:
    """Days and months a query names, and the character spans that named them."""

    days: list[date] = field(default_factory=list)
    months: list[tuple[int, int]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)

    def covers(self, start: int, end: int) -> bool:
        """True when text[start:end] lies inside a date expression."""
        return any(first <= start and end <= last for first, last in self.spans)


def day_key(day: date) -> str:
    """The one-word key of a day in the `dates` column ("d20231013")."""
    return f"d{day.year:04d}{day.month:02d}{day.day:02d}"


def month_key(month: int, year: int) -> str:
    """The one-word key of a month in the `dates` column ("m202310")."""
    return f"m{year:04d}{month:02d}"


@functools.lru_cache(maxsize=4096)
def dates_column(days: tuple[date, ...]) -> str:
    """The `dates` column of a unit dated by *days*: the key of each day, then of each month."""
    return " ".join(dict.fromkeys([*map(day_key, days), *(month_key(day.month, day.year) for day in days)]))


def event_days(text: str, said: date | datetime | None) -> list[date]:
    """The days a message (or note) written at *said* names: the dates of the events it speaks of, beside
    its own timestamp. "next Friday", "the 10th of February", "31.12.2023", "two days ago" read from *said*."""
    lowered = text.lower() if text else ""
    now = said if isinstance(said, datetime) else datetime.combine(said, datetime.min.time()) if said else None
    # str.find, not a regular expression: a regular expression's pass over every text cost more than the rest.
    digit = min((at for at in map(lowered.find, "0123456789") if at >= 0), default=-1)
    if digit < 0 and "day" not in lowered and "tomorrow" not in lowered and " week" not in lowered \
            and "last night" not in lowered:
        return []
    days: list[date] = []
    places = []
    if digit >= 0:
        if stamps := set(STAMP.findall(lowered, digit)):
            # ISO dates and timestamps, the commonest by far ([RAW] entries): read at once, then out of the way.
            days += [day for year, month, number in sorted(stamps) for day in _valid(year, month, number)]
            lowered = STAMP.sub("#", lowered)
        places = [match.span() for match in DIGITS.finditer(lowered, digit)]
    near = _day_words(lowered, places)
    if places:
        around = _around(lowered, places)
        if any(hint in around for hint in DATE_HINTS) or DOTTED_DATE.search(around):
            days += find_time(around, now, nearest=True).days
    if now is not None:
        today = now.date()
        days += [today + timedelta(days=offset) for offset in near + ([1] if "tomorrow" in lowered else [])]
        if "last night" in lowered:  # an evening's event told the next day
            days.append(today - timedelta(days=1))
        if "last weekend" in lowered or "this weekend" in lowered:
            days += weekend(today, last="last weekend" in lowered)
        elif "last week" in lowered or "past week" in lowered:
            days += [today - timedelta(days=offset) for offset in range(1, 8)]
    return list(dict.fromkeys(days))[:MAX_EVENT_DAYS]


def _day_words(lowered: str, places: list[tuple[int, int]]) -> list[int]:
    """Weekday names, "today" and "yesterday" all end in "day": each weekday's place is added to *places*,
    and the day offset of the others returned."""
    near = []
    at = lowered.find("day")
    while at >= 0:
        if lowered.endswith(WEEKDAY_STEMS, 0, at):
            places.append((at - 6, at + 3))
        elif lowered.endswith(("to", "yester"), 0, at):
            near.append(-1 if lowered[at - 1] == "r" else 0)
        at = lowered.find("day", at + 3)
    return near


def _around(lowered: str, places: list[tuple[int, int]]) -> str:
    """The text around *places*, AROUND_CHARS on either side, the pieces joined by " | "."""
    places.sort()
    pieces, low, high = [], places[0][0], places[0][1]
    for start, end in places[1:]:
        if start - high > 2 * AROUND_CHARS:
            pieces.append(lowered[max(0, low - AROUND_CHARS):high + AROUND_CHARS])
            low = start
        high = max(high, end)
    pieces.append(lowered[max(0, low - AROUND_CHARS):high + AROUND_CHARS])
    return " | ".join(pieces)


def find_time(text: str, now: datetime | None = None, *, nearest: bool = False) -> TimeIntent:
    """Every date, month, range and (given *now*) relative day named in *text*. A day named without a year
    is the last and the next such day (a question may ask about either), or with *nearest* the nearer."""
    intent = TimeIntent()
    _absolute_days(text, intent)
    if now is not None:
        _yearless_days(text, now.date(), intent, nearest)
    for match in MONTH_YEAR.finditer(text):
        if not intent.covers(match.start(), match.end()):
            intent.months.append((month_number(match.group(1)), int(match.group(2))))
            intent.spans.append(match.span())
    _ranges(text, intent)
    if now is not None:
        _relative(text, now, intent)
    return intent


def month_number(name: str) -> int:
    """1-12 for a month name, its abbreviation or its number."""
    if name.isdigit():
        return int(name)
    prefix = name.lower()[:3]
    return next(number for number, month in enumerate(MONTHS, start=1) if month.startswith(prefix))


def _absolute_days(text: str, intent: TimeIntent) -> None:
    found: list[tuple[int, int, date]] = []
    # (pattern, group of the year, of the month, of the day)
    for pattern, year, month, day in ((DAY_MONTH_YEAR, 3, 2, 1), (MONTH_DAY_YEAR, 3, 1, 2), (ISO_DATE, 1, 2, 3),
                                      (DOTTED_DATE, 3, 2, 1)):
        for match in pattern.finditer(text):
            found += [(*match.span(), named) for named in _valid(*match.group(year, month, day))]
    for start, end, day in sorted(found):
        intent.days.append(day)
        intent.spans.append((start, end))


def _yearless_days(text: str, today: date, intent: TimeIntent, nearest: bool) -> None:
    """A day and month named without a year: that day in the years around *today*, the last and the next
    (or the nearer)."""
    found = [(match.span(), match.group(2), match.group(1)) for match in DAY_MONTH.finditer(text)]
    found += [(match.span(), match.group(1), match.group(2)) for match in MONTH_DAY.finditer(text)]
    for (start, end), name, number in sorted(found):
        if intent.covers(start, end) or any(start < last and first < end for first, last in intent.spans):
            continue
        candidates = [day for year in (today.year - 1, today.year, today.year + 1)
                      for day in _valid(str(year), name, number)]
        if not candidates:
            continue
        if nearest:
            intent.days.append(min(candidates, key=lambda day: abs((day - today).days)))
        else:
            intent.days += [day for day in (max((day for day in candidates if day <= today), default=None),
                                            min((day for day in candidates if day > today), default=None)) if day]
        intent.spans.append((start, end))


def _ranges(text: str, intent: TimeIntent) -> None:
    """"between <day> and <date>": every day of the range, the first end's year taken from the second."""
    for match in RANGE_START.finditer(text):
        following = [(start, day) for (start, _), day in zip(intent.spans, intent.days, strict=False)
                     if start == match.end()]
        if not following:
            continue
        last = following[0][1]
        name, number = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
        first = _valid(str(last.year), name, number)
        if not first or not 0 < (last - first[0]).days <= MAX_RANGE_DAYS:
            continue
        intent.days += [first[0] + timedelta(days=offset) for offset in range((last - first[0]).days)]
        intent.spans.append(match.span())


def _relative(text: str, now: datetime, intent: TimeIntent) -> None:
    today = now.date()
    for match in RELATIVE.finditer(text):
        phrase = " ".join(match.group(1).lower().split())
        if phrase == "today":
            intent.days.append(today)
        elif phrase in ("yesterday", "last night"):
            intent.days.append(today - timedelta(days=1))
        elif phrase.endswith("week"):
            back = range(1, 8) if phrase.startswith(("last", "past")) else range(0, today.weekday() + 1)
            intent.days += [today - timedelta(days=offset) for offset in back]
        else:
            first_of_month = today.replace(day=1)
            month = first_of_month - timedelta(days=1) if phrase.startswith("last") else today
            intent.months.append((month.month, month.year))
        intent.spans.append(match.span())
    for match in DAYS_AGO.finditer(text):
        days = int(match.group(1)) * (7 if match.group(2).lower().startswith("week") else 1)
        intent.days.append(today - timedelta(days=days))
        intent.spans.append(match.span())
    for match in LAST_WEEKDAY.finditer(text):
        back = (today.weekday() - WEEKDAYS.index(match.group(1).lower())) % 7 or 7
        intent.days.append(today - timedelta(days=back))
        intent.spans.append(match.span())
    for match in FORWARD.finditer(text):
        words = match.group(1).lower().split()
        if words == ["tomorrow"]:
            ahead = 1
        else:
            ahead = (WEEKDAYS.index(words[-1]) - today.weekday()) % 7
            ahead = ahead + 7 if words[0] == "next" and ahead == 0 else ahead or (7 if words[0] != "this" else 0)
        intent.days.append(today + timedelta(days=ahead))
        intent.spans.append(match.span())
    for match in IN_DAYS.finditer(text):
        days = int(match.group(1)) * (7 if match.group(2).lower().startswith("week") else 1)
        intent.days.append(today + timedelta(days=days))
        intent.spans.append(match.span())


def weekend(today: date, *, last: bool) -> list[date]:
    """The Saturday and Sunday of the weekend before *today* (*last*), or of this one (the coming, or the one
    *today* is in): read in messages only, since in a query "weekend" is a word worth searching."""
    saturday = today - timedelta(days=1) if today.weekday() == 6 else today + timedelta(days=5 - today.weekday())
    if last:
        saturday -= timedelta(days=7)
    return [saturday, saturday + timedelta(days=1)]


def _valid(year: str, month: str, day: str) -> list[date]:
    try:
        return [date(int(year), month_number(month), int(day))]
    except ValueError:
        return []
