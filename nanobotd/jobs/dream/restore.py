"""Undoing a dream as a new change, and showing a dream's commit (dream-log); git and file work, so on the git thread.

With git, a run's commit is reverted three-way: later unrelated edits survive, overlapping ones refuse the restore
unless forced; without git (a workspace inside another repository) the run's backups are put back. Either way the
pre-run cursor and the entries its compaction removed return, and the note bullets it read are unread again."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from nanobotd.gitstore.repo import DREAM_PREFIX, GitConflict, GitStoreError
from nanobotd.gitstore.store import CURSOR_FILE, SHORT_SHA, GitStore
from nanobotd.jobs.compaction import compacted_entries_missing
from nanobotd.jobs.dreamnotes import mark_dream_notes
from nanobotd.jobs.errors import RestoreRefused
from nanobotd.jobs.runfiles import digest, load_backup, read_or_none, save_backup, write_or_delete
from nanobotd.memory.history import insert_entries, read_dream_cursor
from nanobotd.state.store import RunRecord, StateStore

RUN_ID_PATTERN = re.compile(r"^r-\d{8}-\d{6}-")
RESTORABLE_KINDS = ("dream", "restore")
BACKUP_DIR = "before"


def restore_dream(target: RunRecord | str, *, store: StateStore, git: GitStore, restore_run_id: str | None,
                  force: bool = False, dry_run: bool = False) -> dict:
    """Undo a dream (or dream-restore) run, or one `dream:` commit by sha (nanobot's own too, like its `/dream-restore
    <sha>`), as a new change on the git thread; RestoreRefused, changing nothing, when it cannot apply. The answer
    ({"plan", "commit", "files", "forced", "dry_run", "cursor_before", "cursor_after", "history_restored",
    "files_changed", "reverted"}) goes in the restore run's manifest, so a restore can be restored."""
    restorer = Restorer(store, git, restore_run_id, force, dry_run)
    try:
        return restorer.restore_commit(target) if isinstance(target, str) else restorer.restore_run(target)
    except GitStoreError as exc:
        # GitStore puts files back when its commit fails, so a git error leaves the workspace as it was.
        raise RestoreRefused(f"restore failed: {exc}", conflicts=getattr(exc, "files", None)) from exc


def dream_log(git: GitStore, ref: str | None = None) -> dict:
    """The commit of a run id or sha (default: the newest `dream:` commit) with its diff; git thread only."""
    if ref and RUN_ID_PATTERN.match(ref):
        sha = git.find_commit_for_run(ref)
        if sha is None:
            raise GitStoreError(f"run {ref} made no commit")
        ref = sha
    return git.show(ref)


class Restorer:
    """One restore: builds the plan line by line and, unless a dry run, carries it out."""

    def __init__(self, store: StateStore, git: GitStore, restore_run_id: str | None, force: bool, dry_run: bool):
        self.store, self.git, self.restore_run_id = store, git, restore_run_id
        self.force, self.dry_run = force, dry_run
        self.workspace = git.workspace
        self.memory_dir = self.workspace / "memory"
        self.plan: list[str] = []
        cursor = read_dream_cursor(self.memory_dir)
        self.result: dict = {"plan": self.plan, "commit": None, "files": [], "forced": False, "dry_run": dry_run,
                             "reverted": None, "cursor_before": cursor, "cursor_after": cursor,
                             "history_restored": 0, "files_changed": {}}

    def restore_run(self, run: RunRecord) -> dict:
        """Revert the run's commit (or put back its backups), reset its cursor, return its history."""
        if run.kind not in RESTORABLE_KINDS:
            raise RestoreRefused(f"run {run.run_id} is a {run.kind} run, not a dream")
        if run.state != "finished":
            raise RestoreRefused(f"run {run.run_id} is {run.state}; only a finished run can be restored")
        manifest = run.manifest
        overrides = self.cursor_override(manifest)
        sha = self.commit_of(run)
        if sha:
            backups = {path: load_backup(info.get("backup"))
                       for path, info in manifest.get("files_changed", {}).items()}
            self.revert(sha, overrides, backups)
        else:
            self.put_back_backups(manifest, overrides, f"restore run {run.run_id}")
        self.restore_history(manifest.get("history_compacted") or {})
        self.restore_notes(manifest)
        return self.result

    def restore_commit(self, sha: str) -> dict:
        """Revert one `dream:` commit; a commit of a known run restores that whole run."""
        info = self.git.show(sha)
        if not info["message"].startswith(DREAM_PREFIX):
            raise RestoreRefused(f"commit {sha} is not a dream: commit")
        run = self.store.get_run(info["run_id"]) if info["run_id"] else None
        if run is not None:
            return self.restore_run(run)
        before = self.git.files_before(info["sha"])
        overrides = {CURSOR_FILE: before[CURSOR_FILE]} if CURSOR_FILE in before else {}
        if overrides:
            self.cursor_plan(overrides[CURSOR_FILE])
        self.revert(info["sha"], overrides, before)
        return self.result

    # -- with git ----------------------------------------------------------------------------------
    def commit_of(self, run: RunRecord) -> str | None:
        """The commit carrying the run's trailer (or named in its manifest), when git is used."""
        if not self.git.available:
            return None
        sha = self.git.find_commit_for_run(run.run_id) or run.manifest.get("commit")
        return sha if sha and self.git.has_commit(sha) else None  # gone with a deleted .git: the backups serve

    def revert(self, sha: str, overrides: dict[str, bytes | None], fallback: dict[str, bytes | None]) -> None:
        """Three-way revert as a new commit; on a conflict, refuse, or (forced) write *fallback*."""
        info = self.git.show(sha)
        self.result["reverted"] = info["sha"]
        try:
            preview = self.git.revert(sha, self.restore_run_id, overrides=overrides, dry_run=True)
        except GitConflict as exc:
            self.forced_restore(info, exc, {**fallback, **overrides})
            return
        self.plan.insert(0, f"revert commit {info['sha'][:SHORT_SHA]} ({info['summary']}) as a new commit")
        self.plan.insert(1, f"files: {', '.join(preview['files']) or '(already as before the run)'}")
        self.carry_out(preview["files"],
                       lambda: self.git.revert(sha, self.restore_run_id, overrides=overrides)["commit"])

    def forced_restore(self, info: dict, conflict: GitConflict, contents: dict[str, bytes | None]) -> None:
        """A conflicting revert: refuse with an explanation, or (forced) write the pre-run contents."""
        explanation = (f"cannot restore {info['sha'][:SHORT_SHA]} ({info['summary']}): "
                       f"{', '.join(conflict.files)} changed since in the same places. Restore with --force to "
                       "put back the content from before the dream of every file it touched (later edits to "
                       "those files are lost).")
        if not self.force:
            raise RestoreRefused(explanation, plan=[*self.plan, explanation], conflicts=conflict.files)
        self.result["forced"] = True
        self.plan.insert(0, f"conflict in {', '.join(conflict.files)}: --force puts back the content from before "
                            f"commit {info['sha'][:SHORT_SHA]} of {', '.join(sorted(contents))} as a new commit")
        self.write(contents, f"restore {info['sha'][:SHORT_SHA]} (forced)")

    # -- from backups ------------------------------------------------------------------------------
    def put_back_backups(self, manifest: dict, overrides: dict[str, bytes | None], message: str) -> None:
        """No commit to revert (no git, or nothing committed): use the run's own backups."""
        contents, conflicts = {}, []
        for path, info in manifest.get("files_changed", {}).items():
            backup = load_backup(info.get("backup"))
            current = read_or_none(self.workspace / path)
            if current != backup and (current is None or digest(current) != info.get("after_sha256")):
                conflicts.append(path)
            contents[path] = backup
        if conflicts and not self.force:
            explanation = (f"{', '.join(conflicts)} changed after the run; restore with --force to put back the "
                           "content from before the run (later edits to those files are lost).")
            raise RestoreRefused(explanation, plan=[*self.plan, explanation], conflicts=conflicts)
        self.result["forced"] = bool(conflicts)
        if contents:
            self.plan.insert(0, f"put back the content from before the run of {', '.join(sorted(contents))} "
                                "from the run's backups")
        self.write({**contents, **overrides}, message)

    def write(self, contents: dict[str, bytes | None], message: str) -> None:
        """Write what differs, backed up first, as one commit (or plain atomic writes without git)."""
        changed = {path: data for path, data in contents.items() if read_or_none(self.workspace / path) != data}

        def change() -> str | None:
            if self.git.available:
                return self.git.restore_files(changed, message, self.restore_run_id)
            for path, data in changed.items():
                write_or_delete(self.workspace / path, data, root=self.workspace)
            return None

        self.carry_out(sorted(changed), change)

    def carry_out(self, paths: list[str], change: Callable[[], str | None]) -> None:
        """Unless a dry run (or nothing differs): back up *paths*, make the *change* (its commit), record it."""
        self.result["files"] = paths
        if self.dry_run or not paths:
            return
        backups = self.back_up(paths)
        self.result["commit"] = change()
        self.record_changes(backups)

    # -- cursor, history, backups of the restore itself ----------------------------------------------
    def cursor_override(self, manifest: dict) -> dict[str, bytes | None]:
        """The cursor file as it was before the run: the backup's exact bytes (or absence) when known."""
        cursor_before = manifest.get("cursor_before")
        if not isinstance(cursor_before, int) or isinstance(cursor_before, bool):
            return {}
        data: bytes | None = str(cursor_before).encode()
        backup = manifest.get("cursor_backup")
        if backup and Path(backup).is_file() and _cursor_value(Path(backup).read_bytes()) == cursor_before:
            data = Path(backup).read_bytes()
        elif "cursor_backup" in manifest and backup is None and cursor_before == 0:
            data = None
        self.cursor_plan(data)
        return {CURSOR_FILE: data}

    def cursor_plan(self, data: bytes | None) -> None:
        """Note the cursor move in the plan and the result."""
        now = read_dream_cursor(self.memory_dir)
        target = _cursor_value(data)
        self.result["cursor_before"], self.result["cursor_after"] = now, target
        if target != now:
            self.plan.append(f"reset {CURSOR_FILE} from {now} to {target}")

    def restore_history(self, compacted: dict) -> None:
        """Put back the history entries the run's compaction removed (those still missing)."""
        missing = compacted_entries_missing(self.memory_dir, compacted)
        if not missing:
            return
        self.plan.append(f"put back {len(missing)} history entries (cursors {missing[0].cursor}-{missing[-1].cursor})"
                         " removed by the run's history compaction")
        if not self.dry_run:
            self.result["history_restored"] = insert_entries(self.memory_dir, missing)

    def restore_notes(self, manifest: dict) -> None:
        """The note bullets a dream read count as unread again; restoring that restore marks them read again."""
        for key, read, undone_key in (("notes_read", False, "notes_unread"), ("notes_unread", True, "notes_read")):
            digests = manifest.get(key) or {}
            if not isinstance(digests, dict) or not digests:
                continue
            count = sum(len(day_digests) for day_digests in digests.values())
            self.plan.append(f"mark {count} daily-note bullet(s) of {', '.join(sorted(digests))} as "
                             f"{'read' if read else 'unread'} by the dream")
            if not self.dry_run:
                mark_dream_notes(self.memory_dir, digests, read=read)
                self.result[undone_key] = digests

    def back_up(self, paths: list[str]) -> dict[str, tuple[bytes | None, str | None]]:
        """Keep the pre-restore content in the restore run's folder, so the restore can be undone too."""
        folder = self.store.run_dir(self.restore_run_id) / BACKUP_DIR
        backups = {}
        for path in paths:
            data = read_or_none(self.workspace / path)
            backups[path] = (data, save_backup(folder, path, data))
        return backups

    def record_changes(self, backups: dict[str, tuple[bytes | None, str | None]]) -> None:
        """Describe what this restore changed in the shape of a dream manifest, so it can be restored too."""
        for path, (before, backup) in backups.items():
            if path == CURSOR_FILE:
                self.result["cursor_backup"] = backup
                continue
            self.result["files_changed"][path] = change_entry(before, read_or_none(self.workspace / path), backup)
        logger.info("restore {} changed {}", self.restore_run_id, ", ".join(sorted(backups)) or "nothing")


def _cursor_value(data: bytes | None) -> int:
    text = (data or b"").strip()
    return int(text) if text.isdigit() else 0


def change_entry(before: bytes | None, after: bytes | None, backup: str | None) -> dict:
    """A manifest's record of one file a run changed: lines added and removed, its backup, a digest of *after*."""
    added, removed = line_counts(before, after)
    return {"added": added, "removed": removed, "backup": backup,
            "after_sha256": digest(after) if after is not None else None}


def line_counts(before: bytes | str | None, after: bytes | str | None) -> tuple[int, int]:
    """(added, removed) lines between two versions of a file, as a unified diff counts them."""
    texts = [value.decode("utf-8", "replace") if isinstance(value, bytes) else value or "" for value in (before, after)]
    added = removed = 0
    for line in difflib.unified_diff(texts[0].splitlines(), texts[1].splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed
