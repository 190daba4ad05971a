"""How nanobotd shows a moment in its API and status: local time, ISO 8601, to the second."""

from __future__ import annotations

import time

ISO_LOCAL_FORMAT = "%Y-%m-%dT%H:%M:%S"


def iso_local(stamp: float | None) -> str | None:
    """*stamp* (seconds since the epoch) as local `YYYY-MM-DDTHH:MM:SS`; None (or 0, never set) gives None."""
    if not stamp:
        return None
    return time.strftime(ISO_LOCAL_FORMAT, time.localtime(stamp))
