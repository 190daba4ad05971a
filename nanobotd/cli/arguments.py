"""Option values checked as argparse `type=`s: a bad one is `argument --limit: must be ...` and exit 2 before the
daemon is asked (whose error would speak of query parameters). Each converter bears its option's name, which
argparse uses in some messages."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
DURATION = re.compile(r"^\s*\d+(?:\.\d+)?\s*[smhdw]\s*$", re.IGNORECASE)


def _converter(option: str, parse: Callable[[str], T | None], accepts: str) -> Callable[[str], T]:
    """A `type=` for *option*: *parse*'s value, or `must be <accepts>, not 'text'` when it gives None."""

    def convert(text: str) -> T:
        value = parse(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"must be {accepts}, not {text!r}")
        return value

    convert.__name__ = option
    return convert


def whole_number(option: str, low: int, high: int) -> Callable[[str], int]:
    """Whole numbers from *low* to *high*, for --limit and --budget."""
    def parse(text: str) -> int | None:
        try:
            value = int(text.strip())
        except ValueError:
            return None
        return value if low <= value <= high else None

    return _converter(option, parse, f"a whole number from {low} to {high:,}")


def positive_number(option: str) -> Callable[[str], float]:
    """Numbers above zero, for --timeout."""
    def parse(text: str) -> float | None:
        try:
            value = float(text)
        except ValueError:
            return None
        return value if value > 0 and not math.isinf(value) else None

    return _converter(option, parse, "a number of seconds above 0, e.g. 30 or 2.5")


def duration_text(option: str) -> Callable[[str], str]:
    """A period like 30m, 12h, 7d or 2w (the daemon parses it)."""
    return _converter(option, lambda text: text.strip() if DURATION.match(text) else None,
                      "a number and a unit (s, m, h, d or w), e.g. 30m, 12h, 7d or 2w")


def workspace_name(text: str) -> str:
    """A workspace name as typed, or a path made absolute: the daemon runs elsewhere and matches full paths."""
    if "/" in text or text.startswith((".", "~")):
        return str(Path(text).expanduser().absolute())
    return text
