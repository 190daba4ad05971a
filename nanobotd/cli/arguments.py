"""Option values checked where they are typed: the error names the option and what it accepts.

argparse calls these as `type=`; a bad value becomes `argument --limit: must be ...` and exit 2, before the
daemon is asked (whose error would speak of query parameters). The option's name becomes the converter's
name, which argparse uses in its own messages. Standard library only, like all of nanobotctl.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

DURATION = re.compile(r"^\s*\d+(?:\.\d+)?\s*[smhdw]\s*$", re.IGNORECASE)


def whole_number(option: str, low: int, high: int) -> Callable[[str], int]:
    """A converter accepting whole numbers from *low* to *high*, for --limit and --budget."""

    def convert(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high:,}, not {text!r}")
        return value

    convert.__name__ = option  # argparse names the converter in some messages
    return convert


def positive_number(option: str) -> Callable[[str], float]:
    """A converter accepting numbers above zero, for --timeout."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not value > 0 or math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, e.g. 30 or 2.5, not {text!r}")
        return value

    convert.__name__ = option
    return convert


def duration_text(option: str) -> Callable[[str], str]:
    """A converter checking a period like 30m, 12h, 7d or 2w (the daemon parses it)."""

    def convert(text: str) -> str:
        if not DURATION.match(text):
            raise argparse.ArgumentTypeError(f"must be a number and a unit (s, m, h, d or w), "
                                             f"e.g. 30m, 12h, 7d or 2w, not {text!r}")
        return text.strip()

    convert.__name__ = option
    return convert


def workspace_name(text: str) -> str:
    """A workspace name as typed, or a path made absolute: the daemon runs elsewhere and matches full paths."""
    if "/" in text or text.startswith((".", "~")):
        return str(Path(text).expanduser().absolute())
    return text
