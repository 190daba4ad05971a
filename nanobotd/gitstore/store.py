"""The workspace's git store: a nanobot-compatible repository, `dream:` commits, exact reverts as new commits. GitPython
is not thread-safe and leaks handles on an open Repo: each operation opens and closes one, on the git thread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loguru import logger

from nanobotd import fsio
from nanobotd.config.paths import MEMORY_FILES
from nanobotd.faults import FaultPoints
from nanobotd.gitstore.repo import (
    DREAM_PREFIX,
    RUN_TRAILER,
    GitConflict,
    GitStoreError,
    describe_error,
    git_options,
    gitpython,
    merge_lines,
    run_id_of,
    three_way,
)
from nanobotd.tuning import GIT_LOCK_RETRY_DELAYS as LOCK_RETRY_DELAYS
from nanobotd.tuning import GIT_STALE_LOCK_SECONDS as STALE_LOCK_SECONDS

CURSOR_FILE = "memory/.dream_cursor"
TRACKED_FILES = (*MEMORY_FILES, CURSOR_FILE)
GITIGNORE_NAME = ".gitignore"
# Files nanobotd leaves in memory/ that are no memory: ignored through the repository's own exclude file,
# which is not tracked, so nanobot's .gitignore (a tracked file) is never changed for them.
EXCLUDE_NAME = Path("info") / "exclude"
EXCLUDED = ("/memory/.history.lock",)
INIT_MESSAGE = "init: nanobot memory store"
SNAPSHOT_TRAILER = "Nanobot-Snapshot"
SNAPSHOT_SUMMARY = "snapshot edits made outside the dream"
DIFF_CAP = 8000
DIFF_TRUNCATED = "... (diff truncated)"
SHORT_SHA = 7
REVERT_ATTEMPTS = 3  # an agent editing a file again and again while a restore merges it refuses the restore


class EditedMeanwhile(GitStoreError):
    """A file changed between the read a write was made from and the write; nothing was written."""


def cap_diff(diff: str) -> str:
    """*diff* cut to DIFF_CAP characters at a line boundary, with a marker when cut."""
    if len(diff) <= DIFF_CAP:
        return diff
    cut = diff[:DIFF_CAP].rsplit("\n", 1)[0]
    return f"{cut}\n{DIFF_TRUNCATED}"


class GitStore:
    """The `<workspace>/.git` repository nanobot uses, or the reason git cannot be used there."""

    def __init__(self, workspace: Path, *, lock_retry_delays: tuple[float, ...] = LOCK_RETRY_DELAYS,
                 faults: FaultPoints | None = None):
        self.workspace = Path(workspace)
        self.faults = faults or FaultPoints()  # "restore.merged": a revert merged, before it writes
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
            git = gitpython()
        except ImportError as exc:
            return self._unavailable(f"git is not usable: {exc}")
        if not (self.workspace / ".git").exists():
            parent_root = self._parent_repository(git)
            if parent_root is not None:
                return self._unavailable(f"workspace is inside the git repository at {parent_root}")
            try:
                self._init_repository(git)
            except (git.exc.GitError, OSError) as exc:
                return self._unavailable(f"git init failed: {describe_error(exc)}")
        self.available, self.reason = True, ""
        self._exclude_own_files()
        try:
            with self._repo() as repo:
                if not repo.head.is_valid():
                    self._commit(repo, [GITIGNORE_NAME, *TRACKED_FILES], INIT_MESSAGE, None, raw=True)
        except GitStoreError as exc:
            return self._unavailable(str(exc))
        return True

    def _exclude_own_files(self) -> None:
        """Keep nanobotd's lock file out of `git status` (nanobot's rules track the whole memory/ folder)."""
        path = self.workspace / ".git" / EXCLUDE_NAME
        try:
            merge_lines(path, EXCLUDED)
        except OSError as exc:  # a .git that is a file (a worktree) or read-only: status shows the lock, no harm
            logger.debug("cannot write {}: {}", path, exc)

    def _unavailable(self, reason: str) -> bool:
        logger.warning("git store for {} is unavailable ({}); dream keeps file backups only", self.workspace, reason)
        self.available, self.reason = False, reason
        return False

    def _parent_repository(self, git: Any) -> str | None:
        start = next(folder for folder in self.workspace.resolve().parents if folder.is_dir())
        try:
            return git.Git(str(start)).rev_parse("--show-toplevel", **git_options()).strip() or None
        except (git.exc.GitError, OSError):
            return None

    def _init_repository(self, git: Any) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        merge_lines(self.workspace / GITIGNORE_NAME)
        git.Repo.init(str(self.workspace)).close()
        logger.info("created the memory git repository at {}", self.workspace / ".git")

    def health(self) -> dict:
        """For status: whether git is used, why not, HEAD, and tracked files changed since the last commit."""
        data = {"available": self.available, "reason": self.reason, "head": None, "dirty_tracked_files": []}
        if not self.available:
            return data
        if not (self.workspace / ".git").exists():  # made again by the next git operation, on the git thread
            data["reason"] = f"{self.workspace / '.git'} is gone; the next dream or restore makes it again"
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
        """Commit *paths* as `dream: <summary>` (stats, *notes*, capped diff, run trailer); the sha, None when
        nothing changed. Call `snapshot_outside_edits` before writing, so it holds only the run's change."""
        with self._repo() as repo:
            return self._commit(repo, paths, summary, f"{RUN_TRAILER}: {run_id}", notes=notes)

    def unstage(self, paths: list[str]) -> None:
        """Take *paths* out of the index again (as HEAD has them): a commit that failed after staging them
        leaves them staged, and the files put back would show as changed."""
        with self._repo() as repo:
            tracked = set(repo.git.ls_files("-z", "--", *paths, **git_options()).split("\0")) - {""}
            if tracked:
                repo.git.reset("-q", "HEAD", "--", *sorted(tracked), **git_options())

    def snapshot_outside_edits(self, run_id: str) -> str | None:
        """Commit edits the agent made to the content files since the last commit (before a run writes)."""
        with self._repo() as repo:
            return self._snapshot_outside_edits(repo, run_id)

    def _snapshot_outside_edits(self, repo: Any, run_id: str) -> str | None:
        dirty = self._dirty(repo, MEMORY_FILES)
        if not dirty:
            return None
        notes = "Files the agent edited since the last dream commit, recorded before the run changes them."
        return self._commit(repo, dirty, SNAPSHOT_SUMMARY, f"{SNAPSHOT_TRAILER}: {run_id}", notes=notes)

    def restore_files(self, paths_to_content: dict[str, bytes | None], summary: str, run_id: str) -> str | None:
        """Write the given contents (None deletes) and commit them as one new `dream: <summary>` commit."""
        with self._repo() as repo:
            return self._write_and_commit(repo, paths_to_content, summary, run_id)

    def _write_and_commit(self, repo: Any, contents: dict[str, bytes | None], summary: str, run_id: str,
                          notes: str = "", expected: dict[str, bytes | None] | None = None) -> str | None:
        """Snapshot outside edits, write *contents*, commit them; a failed commit puts the files back. EditedMeanwhile,
        nothing written, when a file is no longer as *expected* (what the contents were made from)."""
        self._snapshot_outside_edits(repo, run_id)
        previous = {path: self._read(path) for path in contents}
        if expected is not None and any(previous[path] != expected[path] for path in contents):
            raise EditedMeanwhile(sorted(path for path in contents if previous[path] != expected[path]))
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
            status = repo.git.diff("--cached", "--quiet", "--", *known, with_extended_output=True,
                                   with_exceptions=False, **git_options())[0] if known else 0
            if status == 0:  # nothing staged differs from HEAD
                return None
            message = summary if raw else self._message(repo, known, summary, notes, trailer)
            repo.git(c="commit.gpgsign=false").commit(
                "--no-verify", "--quiet", "--cleanup=verbatim", "-m", message, "--", *known, **git_options())
            return repo.head.commit.hexsha

        return self._with_lock_retry(repo, attempt)

    def _stage(self, repo: Any, paths: list[str]) -> list[str]:
        present = [path for path in paths if (self.workspace / path).is_file() or (self.workspace / path).is_symlink()]
        tracked = set(repo.git.ls_files("-z", "--", *paths, **git_options()).split("\0")) - {""}
        known = [path for path in dict.fromkeys(paths) if path in present or path in tracked]
        if known:
            repo.git.add("-A", "-f", "--", *known, **git_options())
        return known

    def _message(self, repo: Any, paths: list[str], summary: str, notes: str, trailer: str | None) -> str:
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
            stats.append(f"{len(stats)} file{'s' if len(stats) != 1 else ''} changed, "
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

    def _with_lock_retry(self, repo: Any, action: Callable[[], Any]) -> Any:
        """Retry *action* while another git process holds a lock; a lock is removed only when stale."""
        git = gitpython()
        delays = list(self.lock_retry_delays)
        while True:
            try:
                return action()
            except git.exc.GitCommandError as exc:
                if ".lock" not in describe_error(exc) or not delays:
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
        output = repo.git.status("--porcelain", "-z", "--untracked-files=all", "--", *paths, **git_options())
        return sorted({record[3:] for record in output.split("\0") if len(record) > 3 and record[3:] in paths})

    # -- reading history -------------------------------------------------------------------------
    # A commit belongs to the run its last paragraph's `Nanobot-Run:` trailer names; nanobot's own have none.
    def find_commit_for_run(self, run_id: str) -> str | None:
        """The sha of the commit whose trailer names *run_id*, or None."""
        with self._repo() as repo:
            if not repo.head.is_valid():
                return None
            shas = repo.git.log("--format=%H", "--fixed-strings", f"--grep={RUN_TRAILER}: {run_id}", "HEAD",
                                **git_options()).split()
            return next((sha for sha in shas if run_id_of(repo.commit(sha).message) == run_id), None)

    def has_commit(self, sha: str) -> bool:
        """Whether the repository holds commit *sha* (one made before the repository was made again does not)."""
        with self._repo() as repo:
            try:
                return repo.commit(sha).type == "commit"
            except (ValueError, gitpython().exc.BadName):
                return False

    def show(self, ref: str | None = None) -> dict:
        """One commit with its diff and run id (the newest `dream:` commit, ours or nanobot's, when *ref* is
        None), for dream-log and restore."""
        with self._repo() as repo:
            if ref:
                commit = self._resolve(repo, ref)
            else:
                dreams = repo.iter_commits("HEAD") if repo.head.is_valid() else ()
                commit = next((each for each in dreams if each.message.startswith(DREAM_PREFIX)), None)
                if commit is None:
                    raise GitStoreError("there is no dream: commit yet")
            return {"sha": commit.hexsha, "message": commit.message, "summary": commit.summary,
                    "author": f"{commit.author.name} <{commit.author.email}>",
                    "date": commit.committed_datetime.isoformat(), "run_id": run_id_of(commit.message),
                    "diff": repo.git.show(commit.hexsha, "--format=", "--no-color", "--patch", **git_options())}

    def _resolve(self, repo: Any, ref: str) -> Any:
        git = gitpython()
        try:
            return repo.commit(ref)
        except (git.exc.BadName, ValueError, git.exc.GitCommandError) as exc:
            raise GitStoreError(f"no commit {ref!r} in {self.workspace}") from exc

    # -- reverting -------------------------------------------------------------------------------
    def revert(self, sha: str, run_id: str, *, overrides: dict[str, bytes | None] | None = None,
               dry_run: bool = False) -> dict:
        """Undo exactly commit *sha* as a new commit merged with later edits (GitConflict, nothing changed, when
        one overlaps); *overrides* set files outright. {"commit": sha or None, "files": [...], "reverted": sha}."""
        overrides = dict(overrides or {})
        with self._repo() as repo:
            commit = self._resolve(repo, sha)
            if len(commit.parents) != 1:
                raise GitStoreError(f"commit {commit.hexsha[:SHORT_SHA]} has {len(commit.parents)} parents; "
                                    "only an ordinary commit can be restored")
            paths, notes = _changed_paths(repo, commit.parents[0], commit), f"This reverts commit {commit.hexsha}"
            for _ in range(REVERT_ATTEMPTS):  # merged again onto an edit the agent wrote meanwhile
                read = {path: self._read(path) for path in [*paths, *overrides]}
                merged = {**self._reverted_contents(repo, commit, read, skip=tuple(overrides)), **overrides}
                changed = {path: data for path, data in merged.items() if read[path] != data}
                result = {"commit": None, "files": sorted(changed), "reverted": commit.hexsha}
                if dry_run or not changed:
                    return result
                self.faults.reach("restore.merged")
                try:
                    result["commit"] = self._write_and_commit(repo, changed, f"restore {commit.hexsha[:SHORT_SHA]}",
                                                              run_id, notes=f"{notes} ({commit.summary}).",
                                                              expected=read)
                except EditedMeanwhile:
                    continue
                return result
            raise GitStoreError("the agent kept changing the files while the restore merged them")

    def files_before(self, sha: str) -> dict[str, bytes | None]:
        """Each file an ordinary commit changed, as its parent had it (None: it did not exist)."""
        with self._repo() as repo:
            commit = self._resolve(repo, sha)
            parent = commit.parents[0] if len(commit.parents) == 1 else None
            return {path: _blob(parent, path) for path in _changed_paths(repo, parent, commit)} if parent else {}

    def _reverted_contents(self, repo: Any, commit: Any, read: dict[str, bytes | None],
                           skip: tuple[str, ...] = ()) -> dict[str, bytes | None]:
        """The commit's files with its change taken out of their *read* contents (GitConflict where it cannot)."""
        parent = commit.parents[0]
        merged, conflicts = {}, []
        for path in (name for name in read if name not in skip):
            result = three_way(repo, ours=read[path], base=_blob(commit, path), theirs=_blob(parent, path))
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
                fsio.confine(full, self.workspace).unlink(missing_ok=True)
            else:
                fsio.atomic_write(full, data, root=self.workspace)

    @contextlib.contextmanager
    def _repo(self) -> Iterator[Any]:
        """One Repo for one operation, always closed (GitPython leaks handles otherwise); errors become ours."""
        if not self.available:
            raise GitStoreError(f"git is unavailable: {self.reason}")
        if self.workspace.is_dir() and not (self.workspace / ".git").exists():  # removed, or a copy without it
            logger.warning("{} is gone; making the memory repository again, as nanobot does", self.workspace / ".git")
            if not self.open():
                raise GitStoreError(f"git is unavailable: {self.reason}")
        git = gitpython()
        try:
            repo = git.Repo(str(self.workspace))
        except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError) as exc:
            raise GitStoreError(f"{self.workspace} is not a git repository: {exc}") from exc
        with repo:
            try:
                yield repo
            except (git.exc.GitError, ValueError, OSError) as exc:
                raise GitStoreError(f"git failed in {self.workspace}: {describe_error(exc)}") from exc


def _changed_paths(repo: Any, parent: Any, commit: Any) -> list[str]:
    """The paths that differ between *parent* and *commit* (renames counted as delete + add)."""
    names = repo.git.diff("--name-only", "--no-renames", "-z", parent.hexsha, commit.hexsha, **git_options())
    return [name for name in names.split("\0") if name]


def _blob(commit: Any, path: str) -> bytes | None:
    """A file's bytes at *commit*, or None when it does not exist there."""
    try:
        return (commit.tree / path).data_stream.read()
    except KeyError:
        return None
