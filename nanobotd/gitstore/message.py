"""A dream commit's message, as nanobot writes one: the summary, per-file line stats, notes, the diff (capped)."""

from __future__ import annotations

from typing import Any

from nanobotd.gitstore.repo import DREAM_PREFIX, git_options

CURSOR_FILE = "memory/.dream_cursor"
DIFF_CAP = 8000
DIFF_TRUNCATED = "... (diff truncated)"


def cap_diff(diff: str) -> str:
    """*diff* cut to DIFF_CAP characters at a line boundary, with a marker when cut."""
    if len(diff) <= DIFF_CAP:
        return diff
    cut = diff[:DIFF_CAP].rsplit("\n", 1)[0]
    return f"{cut}\n{DIFF_TRUNCATED}"


def commit_message(repo: Any, paths: list[str], summary: str, notes: str, trailer: str | None) -> str:
    """`dream: <summary>`, the staged *paths*' line stats, *notes*, their capped diff and the *trailer*."""
    stats, added_total, removed_total = [], 0, 0
    for line in repo.git.diff("--cached", "--numstat", "--", *paths, **git_options()).splitlines():
        added, removed, path = line.split("\t", 2)
        if path == CURSOR_FILE:
            continue
        stats.append(f"{path}: +{added} -{removed}")
        added_total += int(added) if added.isdigit() else 0
        removed_total += int(removed) if removed.isdigit() else 0
    content_paths = [path for path in paths if path != CURSOR_FILE]
    parts = [f"{DREAM_PREFIX} {summary}"]
    if stats:
        count = len(stats)
        stats.append(f"{count} file{'s' if count != 1 else ''} changed, "
                     f"{added_total} insertions(+), {removed_total} deletions(-)")
        parts.append("\n".join(stats))
    if notes.strip():
        parts.append(notes.strip())
    diff = repo.git.diff("--cached", "--no-color", "--", *content_paths, **git_options()) if content_paths else ""
    if diff.strip():
        parts.append(f"```diff\n{cap_diff(diff)}\n```")
    if trailer:
        parts.append(trailer)
    return "\n\n".join(parts) + "\n"
