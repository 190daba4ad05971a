"""Calling git for the store through `git_options()` (nanobot's identity, no prompts, a timeout), failures as
GitStoreError; the run trailer; merges keeping others' work (a revert three-way per file; ignores beside theirs)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from nanobotd import fsio
from nanobotd.tuning import GIT_TIMEOUT_SECONDS

AUTHOR_NAME = "nanobot"
AUTHOR_EMAIL = "nanobot@dream"
ERROR_TEXT_LIMIT = 500
DREAM_PREFIX = "dream:"
RUN_TRAILER = "Nanobot-Run"
TRAILER_PATTERN = re.compile(rf"^{RUN_TRAILER}:\s*(\S+)\s*$", re.MULTILINE)
GITIGNORE_LINES = ("/*", "!memory/", "!SOUL.md", "!USER.md", "!memory/MEMORY.md", "!.gitignore")
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


def run_id_of(message: str) -> str | None:
    """The run id in a commit message's `Nanobot-Run:` trailer, or None (e.g. nanobot's own dream)."""
    paragraphs = [part for part in message.strip().split("\n\n") if part.strip()]
    if not paragraphs:
        return None
    match = TRAILER_PATTERN.search(paragraphs[-1])
    return match.group(1) if match else None


def three_way(repo: Any, *, ours: bytes | None, base: bytes | None, theirs: bytes | None) -> bytes | None | bool:
    """Merge a revert for one file (base = the commit's version, theirs = its parent's); False on conflict."""
    if ours == base or ours == theirs:
        return theirs
    if base == theirs:
        return ours
    if ours is None or base is None or theirs is None:
        return False
    with tempfile.TemporaryDirectory(prefix="nanobotd-merge-") as folder:
        names = []
        for label, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (Path(folder) / label).write_bytes(data)
            names.append(str(Path(folder) / label))
        status, output, _ = repo.git.merge_file("-p", *names, with_extended_output=True, with_exceptions=False,
                                                stdout_as_string=False, strip_newline_in_stdout=False,
                                                **git_options())
    return output if status == 0 else False


def merge_lines(path: Path, wanted: tuple[str, ...] = GITIGNORE_LINES) -> None:
    """Add the *wanted* lines (nanobot's ignore rules) *path* lacks, keeping its own lines."""
    try:
        existing = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        existing = ""
    lines = existing.splitlines()
    missing = [line for line in wanted if line not in lines]
    if not missing:
        return
    text = existing if not existing or existing.endswith("\n") else existing + "\n"
    fsio.atomic_write(path, text + "".join(line + "\n" for line in missing), root=path.parent)
