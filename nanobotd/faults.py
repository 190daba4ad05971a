"""Named fault points, where a test kills the daemon or fails a write at the exact step instead of hoping a timed kill
lands there. Armed through the environment, `NANOBOTD_FAULTS="restore.history_rewritten=kill,..."`: `kill` (SIGKILL),
`enospc` (OSError ENOSPC), `drop` (the point's code skips its work: `drops(name)`), `abort` (FaultAbort, which nanobotd
never catches: a kill inside a test's own process), `hold:PATH` (wait there until PATH exists, at most HOLD_SECONDS)."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

ENV_NAME = "NANOBOTD_FAULTS"
ACTIONS = ("kill", "enospc", "drop", "abort", "hold:PATH")
HOLD_SECONDS = 120.0


class FaultAbort(BaseException):
    """The step died at a fault point armed with `abort` (a BaseException, as a kill passes every handler)."""


@dataclass(frozen=True)
class FaultPoints:
    """The armed points (name -> action); the empty default arms none."""

    armed: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FaultPoints:
        """The points armed in *environ*; an unknown action is refused, so a typo in a test cannot pass silently."""
        armed = {}
        for item in filter(None, (part.strip() for part in environ.get(ENV_NAME, "").split(","))):
            name, _, action = item.partition("=")
            if action not in ACTIONS[:4] and not action.startswith("hold:/"):
                raise ValueError(f"{ENV_NAME}: {item!r}: the action must be one of {', '.join(ACTIONS)}")
            armed[name] = action
        return cls(armed)

    def reach(self, name: str) -> None:
        """The code is at point *name*: do what the point is armed with, if anything."""
        action = self.armed.get(name)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "abort":
            raise FaultAbort(f"fault point {name}")
        elif action == "enospc":
            raise OSError(errno.ENOSPC, f"No space left on device (fault point {name})")
        elif action is not None and action.startswith("hold:"):
            until = Path(action.removeprefix("hold:"))
            logger.warning("fault point {}: holding until {} exists", name, until)
            deadline = time.monotonic() + HOLD_SECONDS
            while not until.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def drops(self, name: str) -> bool:
        """Whether point *name* is armed to skip its work (an event lost as an inotify overflow loses it)."""
        return self.armed.get(name) == "drop"
