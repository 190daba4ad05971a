"""One daemon per state folder and per workspace (two would both archive every message): an flock on `nanobotd.lock` in
the state folder and `.nanobotd.lock` atop each workspace, held for life, the file naming pid and socket so a second
daemon names the first and exits 1. The kernel drops a dead holder's flock, so a lock file left behind holds nothing."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from pathlib import Path

from loguru import logger

from nanobotd.state.store import LOCK_NAME as STATE_LOCK_NAME
from nanobotd.tuning import HOLDER_READ_PAUSE, HOLDER_READ_TRIES

# At the top of the workspace, which nanobot's own .gitignore ("/*") keeps out of its memory repository.
WORKSPACE_LOCK_NAME = ".nanobotd.lock"
HOLDER_MAX_BYTES = 4096


class AlreadyRunning(RuntimeError):
    """Another daemon holds a lock this one needs (its message names it): this one must exit."""


class DaemonLocks:
    """The locks one daemon holds, by file; each kept until released, all released when the daemon stops."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = Path(socket_path)
        self._held: dict[Path, tuple[int, str]] = {}  # lock file (resolved) -> (descriptor, what it guards)
        self._unlocked: set[Path] = set()  # workspace lock files that could not be made

    def take_state(self, state_dir: Path) -> None:
        """Lock the state folder (made if missing); AlreadyRunning when another daemon has it."""
        Path(state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._take(Path(state_dir) / STATE_LOCK_NAME, f"the state folder {state_dir}", "state_dir")

    def take_workspace(self, name: str, path: Path) -> None:
        """Lock workspace *name*; AlreadyRunning when another daemon has it. One where no lock file can be made (a
        read-only mount) is worked on unlocked, with a warning: that is no second daemon."""
        lock_path = Path(path) / WORKSPACE_LOCK_NAME
        try:
            self._take(lock_path, f"workspace {name} ({path})", "workspace")
        except OSError as exc:
            logger.warning("workspace {}: cannot lock {} ({}); a second daemon on it would not be noticed", name,
                           lock_path, exc)
            self._unlocked.add(lock_path.resolve())

    def holds_workspace(self, path: Path) -> bool:
        """The workspace was taken (or found unlockable: it is not tried again)."""
        key = (Path(path) / WORKSPACE_LOCK_NAME).resolve()
        return key in self._held or key in self._unlocked

    def release_workspace(self, path: Path) -> None:
        """Let a workspace go (dropped from the config)."""
        key = (Path(path) / WORKSPACE_LOCK_NAME).resolve()
        self._unlocked.discard(key)
        held = self._held.pop(key, None)
        if held is not None:
            os.close(held[0])  # closing the only descriptor of the file drops its flock

    def release_all(self) -> None:
        for descriptor, _ in self._held.values():
            os.close(descriptor)
        self._held.clear()
        self._unlocked.clear()

    def _take(self, lock_path: Path, what: str, setting: str) -> None:
        key = lock_path.resolve()
        if key in self._held:
            raise AlreadyRunning(f"{what} is the same folder as {self._held[key][1]}; list it once")
        descriptor = _open(lock_path)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(descriptor) if exc.errno in (errno.EAGAIN, errno.EACCES) else None
            os.close(descriptor)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise AlreadyRunning(f"another nanobotd (pid {holder.get('pid', 'unknown')}, socket "
                                 f"{holder.get('socket', 'unknown')}) already runs on {what}, holding {lock_path}; "
                                 f"one daemon per state folder and per workspace: stop that one, or give this one "
                                 f"another {setting}") from None
        _write_holder(descriptor, {"pid": os.getpid(), "socket": str(self.socket_path)})
        self._held[key] = (descriptor, what)


def _open(lock_path: Path) -> int:
    """The lock file, opened for writing where we may (a file of another user is read only: flock works on it)."""
    try:
        return os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        return os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)


def _write_holder(descriptor: int, holder: dict) -> None:
    # Written in place, not atomically: only the live holder's flock matters; these words only name it.
    with contextlib.suppress(OSError):  # read-only (another user's file): the lock holds all the same
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)


def _read_holder(descriptor: int) -> dict:
    """What the lock's holder wrote about itself ({} when it never says)."""
    for _ in range(HOLDER_READ_TRIES):
        try:
            holder = json.loads(os.pread(descriptor, HOLDER_MAX_BYTES, 0) or b"null")
        except (OSError, ValueError):
            holder = None
        if isinstance(holder, dict):
            return holder
        time.sleep(HOLDER_READ_PAUSE)
    return {}
