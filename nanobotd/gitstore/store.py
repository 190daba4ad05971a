"""The workspace's git store: a nanobot-compatible repository, `dream:` commits, exact reverts.

GitPython is not thread-safe and leaks file handles when a Repo stays open, so every operation opens one
Repo and closes it, and every public sync method must run on the store's single git thread: call it
through `await store.call(store.method, ...)` (tests may call the sync methods directly).
History is never rewritten or reset: a restore is a new commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

from loguru import logger

from nanobotd import fsio

CONTENT_FILES = ("SOUL.md", "USER.md", "memory/MEMORY.md")
CURSOR_FILE = "memory/.dream_cursor"
TRACKED_FILES = (*CONTENT_FILES, CURSOR_FILE)
GITIGNORE_NAME = ".gitignore"
GITIGNORE_LINES = ("/*", "!memory/", "!SOUL.md", "!USER.md", "!memory/MEMORY.md", "!.gitignore")
AUTHOR_NAME = "nanobot"
AUTHOR_EMAIL = "nanobot@dream"
INIT_MESSAGE = "init: nanobot memory store"
DREAM_PREFIX = "dream:"
RUN_TRAILER = "Nanobot-Run"
SNAPSHOT_TRAILER = "Nanobot-Snapshot"
SNAPSHOT_SUMMARY = "snapshot edits made outside the dream"
DIFF_CAP = 8000
DIFF_TRUNCATED = "... (diff truncated)"
LOCK_RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)
STALE_LOCK_SECONDS = 600
GIT_TIMEOUT_SECONDS = 60
SHORT_SHA = 7
GIT_ENV = {
    "GIT_AUTHOR_NAME": AUTHOR_NAME,
    "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
    "GIT_COMMITTER_NAME": AUTHOR_NAME,
    "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
    "GIT_TERMINAL_PROMPT": "0",
}
TRAILER_PATTERN = re.compile(rf"^{RUN_TRAILER}:\s*(\S+)\s*$", re.MULTILINE)


class GitStoreError(Exception):
    """A git operation failed or git is unavailable for this workspace."""


class GitConflict(GitStoreError):
    """A revert would conflict with later edits; nothing was changed."""

    def __init__(self, message: str, files: list[str]):
        super().__init__(message)
        self.files = files


def _gitpython() -> Any:
    # Imported on first use: GitPython probes for the git binary at import time.
    import git

    return git


def run_id_of(message: str) -> str | None:
    """The run id in a commit message's `Nanobot-Run:` trailer, or None (e.g. nanobot's own dream)."""
    paragraphs = [part for part in message.strip().split("\n\n") if part.strip()]
    if not paragraphs:
        return None
    match = TRAILER_PATTERN.search(paragraphs[-1])
    return match.group(1) if match else None


def cap_diff(diff: str, limit: int = DIFF_CAP) -> str:
    """*diff* cut to *limit* characters at a line boundary, with a marker when cut."""
    if len(diff) <= limit:
        return diff
    cut = diff[:limit].rsplit("\n", 1)[0]
    return f"{cut}\n{DIFF_TRUNCATED}"


class GitStore:
    """The `<workspace>/.git` repository nanobot uses, or the reason git cannot be used there."""

    def __init__(self, workspace: Path, *, lock_retry_delays: tuple[float, ...] = LOCK_RETRY_DELAYS):
        self.workspace = Path(workspace)
        self.available = False
        self.opened = False
        self.reason = "not opened yet"
        self.lock_retry_delays = lock_retry_delays
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="git")

    # -- threading -------------------------------------------------------------------------------
    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a sync method (or any function doing git or memory-file work) on the git thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Finish queued git work and stop the git thread."""
        self._executor.shutdown(wait=True)

    # -- setup and health ------------------------------------------------------------------------
    def open(self) -> bool:
        """Use `<workspace>/.git` (creating it as nanobot does) unless a parent repository owns the folder."""
        self.opened = True
        try:
            git = _gitpython()
        except ImportError as exc:
            return self._unavailable(f"git is not usable: {exc}")
        if not (self.workspace / ".git").exists():
            parent_root = self._parent_repository(git)
            if parent_root is not None:
                return self._unavailable(f"workspace is inside the git repository at {parent_root}")
            try:
                self._init_repository(git)
            except (git.exc.GitError, OSError) as exc:
                return self._unavailable(f"git init failed: {_describe(exc)}")
        self.available, self.reason = True, ""
        try:
            with self._repo() as repo:
                if not repo.head.is_valid():
                    self._commit(repo, [GITIGNORE_NAME, *TRACKED_FILES], INIT_MESSAGE, None, raw=True)
        except GitStoreError as exc:
            return self._unavailable(str(exc))
        return True

    def _unavailable(self, reason: str) -> bool:
        logger.warning("git store for {} is unavailable ({}); dream keeps file backups only", self.workspace, reason)
        self.available, self.reason = False, reason
        return False

    def _parent_repository(self, git: Any) -> str | None:
        start = next(folder for folder in self.workspace.resolve().parents if folder.is_dir())
        try:
            return git.Git(str(start)).rev_parse("--show-toplevel", **_exec()).strip() or None
        except (git.exc.GitError, OSError):
            return None

    def _init_repository(self, git: Any) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        merge_gitignore(self.workspace / GITIGNORE_NAME)
        git.Repo.init(str(self.workspace)).close()
        logger.info("created the memory git repository at {}", self.workspace / ".git")

    def health(self) -> dict:
        """For status: whether git is used, why not, HEAD, and tracked files changed since the last commit."""
        data = {"available": self.available, "reason": self.reason, "head": None, "dirty_tracked_files": []}
        if not self.available:
            return data
        try:
            with self._repo() as repo:
                data["head"] = repo.head.commit.hexsha if repo.head.is_valid() else None
                data["dirty_tracked_files"] = self._dirty(repo, TRACKED_FILES)
        except GitStoreError as exc:
            data["reason"] = str(exc)
        return data

    # -- commits ---------------------------------------------------------------------------------
    def commit(self, paths: list[str], summary: str, run_id: str, *, notes: str = "") -> str | None:
        """Commit *paths* as `dream: <summary>` with stats, *notes*, the capped diff and the run trailer.

        Returns the new sha, or None when the files already match HEAD. Call `snapshot_outside_edits`
        before writing the files, so that this commit holds only the run's own change.
        """
        with self._repo() as repo:
            return self._commit(repo, paths, summary, f"{RUN_TRAILER}: {run_id}", notes=notes)

    def snapshot_outside_edits(self, run_id: str) -> str | None:
        """Commit edits the agent made to the content files since the last commit (before a run writes)."""
        with self._repo() as repo:
            return self._snapshot_outside_edits(repo, run_id)

    def _snapshot_outside_edits(self, repo: Any, run_id: str) -> str | None:
        dirty = self._dirty(repo, CONTENT_FILES)
        if not dirty:
            return None
        notes = "Files the agent edited since the last dream commit, recorded before the run changes them."
        return self._commit(repo, dirty, SNAPSHOT_SUMMARY, f"{SNAPSHOT_TRAILER}: {run_id}", notes=notes)

    def restore_files(self, paths_to_content: dict[str, bytes | None], message: str, run_id: str) -> str | None:
        """Write the given contents (None deletes) and commit them as one new `dream:` commit."""
        summary = message[len(DREAM_PREFIX):].strip() if message.startswith(DREAM_PREFIX) else message
        with self._repo() as repo:
            return self._write_and_commit(repo, paths_to_content, summary, run_id)

    def _write_and_commit(self, repo: Any, contents: dict[str, bytes | None], summary: str, run_id: str,
                          notes: str = "") -> str | None:
        """Snapshot outside edits, write *contents*, commit them; a failed commit puts the files back."""
        self._snapshot_outside_edits(repo, run_id)
        previous = {path: self._read(path) for path in contents}
        self._write_files(contents)
        try:
            return self._commit(repo, sorted(contents), summary, f"{RUN_TRAILER}: {run_id}", notes=notes)
        except BaseException:
            self._write_files(previous)
            raise

    def _commit(self, repo: Any, paths: list[str], summary: str, trailer: str | None, *,
                notes: str = "", raw: bool = False) -> str | None:
        """Stage exactly *paths* and commit only them (other staged work stays staged)."""

        def attempt() -> str | None:
            known = self._stage(repo, paths)
            if not known or not self._has_staged_changes(repo, known):
                return None
            message = summary if raw else self._message(repo, known, summary, notes, trailer)
            repo.git(c="commit.gpgsign=false").commit(
                "--no-verify", "--quiet", "--cleanup=verbatim", "-m", message, "--", *known, **_exec())
            return repo.head.commit.hexsha

        return self._with_lock_retry(repo, attempt)

    def _stage(self, repo: Any, paths: list[str]) -> list[str]:
        present = [path for path in paths if (self.workspace / path).is_file() or (self.workspace / path).is_symlink()]
        tracked = set(repo.git.ls_files("-z", "--", *paths, **_exec()).split("\0")) - {""}
        known = [path for path in dict.fromkeys(paths) if path in present or path in tracked]
        if known:
            repo.git.add("-A", "-f", "--", *known, **_exec())
        return known

    def _has_staged_changes(self, repo: Any, paths: list[str]) -> bool:
        status, _, _ = repo.git.diff("--cached", "--quiet", "--", *paths,
                                     with_extended_output=True, with_exceptions=False, **_exec())
        return status != 0

    def _message(self, repo: Any, paths: list[str], summary: str, notes: str, trailer: str | None) -> str:
        stats, added_total, removed_total = [], 0, 0
        for line in repo.git.diff("--cached", "--numstat", "--", *paths, **_exec()).splitlines():
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
        diff = repo.git.diff("--cached", "--no-color", "--", *content_paths, **_exec()) if content_paths else ""
        if diff.strip():
            parts.append(f"```diff\n{cap_diff(diff)}\n```")
        if trailer:
            parts.append(trailer)
        return "\n\n".join(parts) + "\n"

    def _with_lock_retry(self, repo: Any, action: Callable[[], Any]) -> Any:
        """Retry *action* while another git process holds a lock; a lock is removed only when stale."""
        git = _gitpython()
        delays = list(self.lock_retry_delays)
        while True:
            try:
                return action()
            except git.exc.GitCommandError as exc:
                if ".lock" not in _describe(exc) or not delays:
                    raise
                self._remove_stale_lock(Path(repo.git_dir) / "index.lock")
                time.sleep(delays.pop(0))

    def _remove_stale_lock(self, lock: Path) -> None:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_SECONDS:
            logger.warning("removing stale git lock {} ({:.0f}s old)", lock, age)
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def _dirty(self, repo: Any, paths: tuple[str, ...] | list[str]) -> list[str]:
        output = repo.git.status("--porcelain", "-z", "--untracked-files=all", "--", *paths, **_exec())
        dirty = []
        for record in output.split("\0"):
            if len(record) > 3 and record[3:] in paths:
                dirty.append(record[3:])
        return sorted(set(dirty))

    # -- reading history -------------------------------------------------------------------------
    def log(self, limit: int = 20, *, dream_only: bool = True) -> list[dict]:
        """Newest first: commits (only `dream:` ones by default), nanobot's own included."""
        entries: list[dict] = []
        with self._repo() as repo:
            if not repo.head.is_valid():
                return entries
            for commit in repo.iter_commits("HEAD"):
                if dream_only and not commit.message.startswith(DREAM_PREFIX):
                    continue
                entries.append(_commit_info(commit))
                if len(entries) >= limit:
                    break
        return entries

    def find_commit_for_run(self, run_id: str) -> str | None:
        """The sha of the commit whose trailer names *run_id*, or None."""
        with self._repo() as repo:
            if not repo.head.is_valid():
                return None
            shas = repo.git.log("--format=%H", "--fixed-strings", f"--grep={RUN_TRAILER}: {run_id}",
                                "HEAD", **_exec()).split()
            for sha in shas:
                if run_id_of(repo.commit(sha).message) == run_id:
                    return sha
        return None

    def show(self, ref: str | None = None) -> dict:
        """One commit with its diff (the newest `dream:` commit when *ref* is None), for dream-log."""
        with self._repo() as repo:
            commit = self._resolve(repo, ref) if ref else self._newest_dream_commit(repo)
            info = _commit_info(commit)
            info["diff"] = repo.git.show(commit.hexsha, "--format=", "--no-color", "--patch", **_exec())
            return info

    def _newest_dream_commit(self, repo: Any) -> Any:
        if repo.head.is_valid():
            for commit in repo.iter_commits("HEAD"):
                if commit.message.startswith(DREAM_PREFIX):
                    return commit
        raise GitStoreError("there is no dream: commit yet")

    def _resolve(self, repo: Any, ref: str) -> Any:
        git = _gitpython()
        try:
            return repo.commit(ref)
        except (git.exc.BadName, ValueError, git.exc.GitCommandError) as exc:
            raise GitStoreError(f"no commit {ref!r} in {self.workspace}") from exc

    def file_at(self, ref: str, path: str) -> bytes | None:
        """A file's content at a commit, or None when it does not exist there."""
        with self._repo() as repo:
            return _blob(self._resolve(repo, ref), path)

    # -- reverting -------------------------------------------------------------------------------
    def revert(self, sha: str, run_id: str, *, overrides: dict[str, bytes | None] | None = None,
               dry_run: bool = False) -> dict:
        """Undo exactly commit *sha* as a new commit, merging with later edits as `git revert` does.

        *overrides* set given files outright (the dream cursor). Raises GitConflict, changing nothing,
        when a later edit overlaps. Returns {"commit": new sha or None, "files": [...], "reverted": sha}.
        """
        overrides = dict(overrides or {})
        with self._repo() as repo:
            commit = self._resolve(repo, sha)
            if len(commit.parents) != 1:
                raise GitStoreError(f"commit {commit.hexsha[:SHORT_SHA]} has {len(commit.parents)} parents; "
                                    "only an ordinary commit can be restored")
            merged = self._reverted_contents(repo, commit, set(overrides))
            merged.update(overrides)
            changed = {path: data for path, data in merged.items() if self._read(path) != data}
            result = {"commit": None, "files": sorted(changed), "reverted": commit.hexsha}
            if dry_run or not changed:
                return result
            notes = f"This reverts commit {commit.hexsha} ({commit.summary})."
            result["commit"] = self._write_and_commit(repo, changed, f"restore {commit.hexsha[:SHORT_SHA]}", run_id,
                                                      notes=notes)
            return result

    def changed_files(self, sha: str) -> list[str]:
        """The paths an ordinary commit changed."""
        with self._repo() as repo:
            commit = self._resolve(repo, sha)
            return _changed_paths(repo, commit.parents[0], commit) if len(commit.parents) == 1 else []

    def _reverted_contents(self, repo: Any, commit: Any, skip: set[str]) -> dict[str, bytes | None]:
        parent = commit.parents[0]
        merged, conflicts = {}, []
        for path in (name for name in _changed_paths(repo, parent, commit) if name not in skip):
            self._check_inside(path)
            result = three_way(repo, ours=self._read(path), base=_blob(commit, path), theirs=_blob(parent, path))
            if result is False:
                conflicts.append(path)
            else:
                merged[path] = result
        if conflicts:
            raise GitConflict(
                f"commit {commit.hexsha[:SHORT_SHA]} cannot be reverted cleanly: "
                f"{', '.join(conflicts)} changed since in the same places", conflicts)
        return merged

    # -- files -----------------------------------------------------------------------------------
    def _check_inside(self, path: str) -> Path:
        full = self.workspace / path
        root = self.workspace.resolve()
        if Path(path).is_absolute() or ".." in Path(path).parts or not full.parent.resolve().is_relative_to(root):
            raise GitStoreError(f"refusing to write {path!r} outside the workspace")
        return full

    def _read(self, path: str) -> bytes | None:
        full = self._check_inside(path)
        try:
            return full.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def _write_files(self, contents: dict[str, bytes | None]) -> None:
        for path, data in contents.items():
            full = self._check_inside(path)
            if data is None:
                with contextlib.suppress(FileNotFoundError):
                    full.unlink()
            else:
                fsio.atomic_write(full, data)

    @contextlib.contextmanager
    def _repo(self) -> Iterator[Any]:
        """One Repo for one operation, always closed; library errors become GitStoreError."""
        if not self.available:
            raise GitStoreError(f"git is unavailable: {self.reason}")
        git = _gitpython()
        try:
            repo = git.Repo(str(self.workspace))
        except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError) as exc:
            raise GitStoreError(f"{self.workspace} is not a git repository: {exc}") from exc
        with repo:
            try:
                yield repo
            except (git.exc.GitError, ValueError, OSError) as exc:
                raise GitStoreError(f"git failed in {self.workspace}: {_describe(exc)}") from exc


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
                                                stdout_as_string=False, strip_newline_in_stdout=False, **_exec())
    return output if status == 0 else False


def merge_gitignore(path: Path) -> None:
    """Add nanobot's ignore rules to *path*, keeping existing lines and never duplicating one."""
    try:
        existing = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        existing = ""
    lines = existing.splitlines()
    missing = [line for line in GITIGNORE_LINES if line not in lines]
    if not missing:
        return
    text = existing if not existing or existing.endswith("\n") else existing + "\n"
    fsio.atomic_write(path, text + "".join(line + "\n" for line in missing))


def _changed_paths(repo: Any, parent: Any, commit: Any) -> list[str]:
    names = repo.git.diff("--name-only", "--no-renames", "-z", parent.hexsha, commit.hexsha, **_exec())
    return [name for name in names.split("\0") if name]


def _blob(commit: Any, path: str) -> bytes | None:
    try:
        return (commit.tree / path).data_stream.read()
    except KeyError:
        return None


def _commit_info(commit: Any) -> dict:
    return {
        "sha": commit.hexsha,
        "message": commit.message,
        "summary": commit.summary,
        "author": f"{commit.author.name} <{commit.author.email}>",
        "date": commit.committed_datetime.isoformat(),
        "run_id": run_id_of(commit.message),
    }


def _exec() -> dict:
    return {"env": GIT_ENV, "kill_after_timeout": GIT_TIMEOUT_SECONDS}


def _describe(exc: BaseException) -> str:
    stderr = getattr(exc, "stderr", None)
    text = stderr if isinstance(stderr, str) and stderr.strip() else str(exc)
    return " ".join(text.split())[:500]
