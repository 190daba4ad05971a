"""Which files a workspace's search covers, and what kind of source each one is. Every sessions folder found is
covered: nanobot's old `<workspace>/sessions/` stays beside the current one until nanobot next starts."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.memory.dailynote import NOTE_NAME
from nanobotd.sessions.file import is_session_file

HISTORY_FILE = "memory/history.jsonl"
NOTE_DIRS = ("memory", "memory/archive")


class SourceSet:
    """The memory files, notes, history and session folders of one workspace (paths resolved)."""

    def __init__(self, workspace: Path, sessions_dirs: Iterable[Path] = ()):
        self.workspace = Path(workspace).expanduser().resolve()
        self.sessions_dirs: tuple[Path, ...] = ()
        self.set_sessions_dirs(sessions_dirs)

    def set_sessions_dirs(self, folders: Iterable[Path]) -> bool:
        """Cover exactly these sessions folders; True when that changed what is covered."""
        resolved = tuple(dict.fromkeys(Path(folder).expanduser().resolve() for folder in folders))
        changed = resolved != self.sessions_dirs
        self.sessions_dirs = resolved
        return changed

    def all(self) -> dict[str, str]:
        """Every file covered, by resolved path, with its source kind."""
        found: dict[str, str] = {}
        for relative in MEMORY_FILES:
            path = self.workspace / relative
            if path.is_file():
                found[str(path)] = "memory"
        for folder in NOTE_DIRS:
            for path in listdir(self.workspace / folder):
                if NOTE_NAME.match(path.name) and path.is_file():
                    found[str(path)] = "note"
        history = self.workspace / HISTORY_FILE
        if history.is_file():
            found[str(history)] = "history"
        for folder in self.sessions_dirs:
            for path in listdir(folder):
                if is_session_file(path) and path.is_file():
                    found.setdefault(str(path), "session")
        return found

    def classify(self, path: Path) -> str | None:
        """The source kind of a (resolved) path that is covered, or None."""
        if path.parent in self.sessions_dirs and is_session_file(path):
            return "session"
        try:
            relative = path.relative_to(self.workspace).as_posix()
        except ValueError:
            return None
        if relative in MEMORY_FILES:
            return "memory"
        if relative == HISTORY_FILE:
            return "history"
        if Path(relative).parent.as_posix() in NOTE_DIRS and NOTE_NAME.match(path.name):
            return "note"
        return None

    def display_path(self, stored: str) -> str:
        """Workspace-relative when the file is inside the workspace, else absolute."""
        try:
            return Path(stored).relative_to(self.workspace).as_posix()
        except ValueError:
            return stored


def listdir(folder: Path) -> list[Path]:
    """The entries of *folder*, sorted; none when it is missing or unreadable."""
    try:
        return sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def file_fingerprint(path: str) -> str | None:
    """Inode, size and mtime of a file: what tells the index and the export that it changed; None when gone."""
    try:
        stat = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return f"{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}"
