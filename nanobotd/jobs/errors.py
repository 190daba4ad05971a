"""Why a run cannot be restored, as types: the control API chooses its HTTP status by them."""

from __future__ import annotations

EXPIRED = "expired"  # in a run's manifest: its backups were pruned after the restore window


class RestoreError(ValueError):
    """The target cannot be restored; the message says why and what to do."""


class UnknownRun(RestoreError, LookupError):
    """No run and no dream commit has that name (a typo, another machine's id)."""


class RestoreRefused(Exception):
    """A restore that would clobber later edits (or cannot apply); nothing was changed."""

    def __init__(self, message: str, *, plan: list[str] | None = None, conflicts: list[str] | None = None):
        super().__init__(message)
        self.plan = plan or []
        self.conflicts = conflicts or []

