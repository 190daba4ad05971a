"""Why a run cannot be restored, as types: the control API chooses its HTTP status by them."""

from __future__ import annotations

from nanobotd.state.store import RunRecord

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


def refuse_if_expired(run: RunRecord) -> None:
    """Refuse runs whose backups were pruned after the restore window."""
    if run.manifest.get(EXPIRED):
        raise RestoreRefused(
            f"run {run.run_id} is past the restore window: its backups were pruned"
            f" by {run.manifest.get('expired_by', 'a lifecycle run')}; it can no longer be restored"
        )
