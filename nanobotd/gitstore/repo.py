"""Calling git for the store: every call through `git_options()` (nanobot's identity, no prompts, a timeout),
every Repo through `open_repo`, so a failure reaches callers only as GitStoreError."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nanobotd.tuning import GIT_TIMEOUT_SECONDS

AUTHOR_NAME = "nanobot"
AUTHOR_EMAIL = "nanobot@dream"
ERROR_TEXT_LIMIT = 500
GIT_ENV = {
    "GIT_AUTHOR_NAME": AUTHOR_NAME,
    "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
    "GIT_COMMITTER_NAME": AUTHOR_NAME,
    "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
    "GIT_TERMINAL_PROMPT": "0",
}


class GitStoreError(Exception):
    """A git operation failed or git is unavailable for this workspace."""


class GitConflict(GitStoreError):
    """A revert would conflict with later edits; nothing was changed."""

    def __init__(self, message: str, files: list[str]):
        super().__init__(message)
        self.files = files


def gitpython() -> Any:
    """The `git` package, imported on first use: GitPython probes for the git binary at import time."""
    import git

    return git


def git_options() -> dict:
    """Keyword arguments for every `repo.git.*` call: nanobot's identity and a kill-after timeout."""
    return {"env": GIT_ENV, "kill_after_timeout": GIT_TIMEOUT_SECONDS}


def describe_error(exc: BaseException) -> str:
    """git's stderr (or the error text) on one short line, for log lines and GitStoreError messages."""
    stderr = getattr(exc, "stderr", None)
    text = stderr if isinstance(stderr, str) and stderr.strip() else str(exc)
    return " ".join(text.split())[:ERROR_TEXT_LIMIT]


@contextlib.contextmanager
def open_repo(workspace: Path) -> Iterator[Any]:
    """One Repo for one operation, always closed (GitPython leaks handles otherwise); errors become ours."""
    git = gitpython()
    try:
        repo = git.Repo(str(workspace))
    except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError) as exc:
        raise GitStoreError(f"{workspace} is not a git repository: {exc}") from exc
    with repo:
        try:
            yield repo
        except (git.exc.GitError, ValueError, OSError) as exc:
            raise GitStoreError(f"git failed in {workspace}: {describe_error(exc)}") from exc
