"""Reading the store's commits back (each function takes an open Repo): a commit belongs to the run its last
paragraph's `Nanobot-Run: <run_id>` trailer names; nanobot's own dream commits have none."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nanobotd.gitstore.repo import GitStoreError, git_options, gitpython

DREAM_PREFIX = "dream:"
RUN_TRAILER = "Nanobot-Run"
TRAILER_PATTERN = re.compile(rf"^{RUN_TRAILER}:\s*(\S+)\s*$", re.MULTILINE)


def run_id_of(message: str) -> str | None:
    """The run id in a commit message's `Nanobot-Run:` trailer, or None (e.g. nanobot's own dream)."""
    paragraphs = [part for part in message.strip().split("\n\n") if part.strip()]
    if not paragraphs:
        return None
    match = TRAILER_PATTERN.search(paragraphs[-1])
    return match.group(1) if match else None


def find_commit_for_run(repo: Any, run_id: str) -> str | None:
    """The sha of the commit whose trailer names *run_id*, or None."""
    if not repo.head.is_valid():
        return None
    shas = repo.git.log("--format=%H", "--fixed-strings", f"--grep={RUN_TRAILER}: {run_id}", "HEAD",
                        **git_options()).split()
    for sha in shas:
        if run_id_of(repo.commit(sha).message) == run_id:
            return sha
    return None


def show_commit(repo: Any, commit: Any) -> dict:
    """*commit* as plain data with its patch and the run it belongs to, for dream-log and restore."""
    return {"sha": commit.hexsha, "message": commit.message, "summary": commit.summary,
            "author": f"{commit.author.name} <{commit.author.email}>", "date": commit.committed_datetime.isoformat(),
            "run_id": run_id_of(commit.message),
            "diff": repo.git.show(commit.hexsha, "--format=", "--no-color", "--patch", **git_options())}


def newest_dream_commit(repo: Any) -> Any:
    """The newest `dream:` commit on HEAD (ours or nanobot's); GitStoreError when there is none."""
    if repo.head.is_valid():
        for commit in repo.iter_commits("HEAD"):
            if commit.message.startswith(DREAM_PREFIX):
                return commit
    raise GitStoreError("there is no dream: commit yet")


def resolve_commit(repo: Any, ref: str, workspace: Path) -> Any:
    """The commit *ref* names (sha, short sha, branch); GitStoreError naming *workspace* when none."""
    git = gitpython()
    try:
        return repo.commit(ref)
    except (git.exc.BadName, ValueError, git.exc.GitCommandError) as exc:
        raise GitStoreError(f"no commit {ref!r} in {workspace}") from exc


def changed_paths(repo: Any, parent: Any, commit: Any) -> list[str]:
    """The paths that differ between *parent* and *commit* (renames counted as delete + add)."""
    names = repo.git.diff("--name-only", "--no-renames", "-z", parent.hexsha, commit.hexsha, **git_options())
    return [name for name in names.split("\0") if name]


def blob(commit: Any, path: str) -> bytes | None:
    """A file's bytes at *commit*, or None when it does not exist there."""
    try:
        return (commit.tree / path).data_stream.read()
    except KeyError:
        return None

