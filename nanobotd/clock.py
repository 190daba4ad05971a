"""Time as nanobotd shows it: epoch seconds rendered as local ISO time."""

from __future__ import annotations

import time


def iso_local(stamp: float | None) -> str | None:
    """Epoch seconds as local `YYYY-MM-DDTHH:MM:SS`; None (or 0) stays None."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp)) if stamp else None
