"""Named fault points, where a test kills the daemon or fails a write at the exact step instead of hoping a timed
kill lands there. Armed through the environment, `NANOBOTD_FAULTS="restore.history_rewritten=kill,..."`:
`kill` (SIGKILL), `enospc` (OSError ENOSPC), `drop` (the point's code skips its work: `drops(name)`).
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

ENV_NAME = "NANOBOTD_FAULTS"
ACTIONS = ("kill", "enospc", "drop")


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
            if action not in ACTIONS:
                raise ValueError(f"{ENV_NAME}: {item!r}: the action must be one of {', '.join(ACTIONS)}")
            armed[name] = action
        return cls(armed)

    def reach(self, name: str) -> None:
        """The code is at point *name*: do what the point is armed with, if anything."""
        action = self.armed.get(name)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "enospc":
            raise OSError(errno.ENOSPC, f"No space left on device (fault point {name})")

    def drops(self, name: str) -> bool:
        """Whether point *name* is armed to skip its work (an event lost as an inotify overflow loses it)."""
        return self.armed.get(name) == "drop"
