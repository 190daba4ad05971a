"""Merging for the store, keeping what someone else wrote: one file of a revert three ways (later unrelated edits
stay, as with `git revert`), and ignore rules added beside the user's own lines."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from nanobotd import fsio
from nanobotd.gitstore.repo import git_options

GITIGNORE_LINES = ("/*", "!memory/", "!SOUL.md", "!USER.md", "!memory/MEMORY.md", "!.gitignore")


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
