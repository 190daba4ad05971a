"""The dream's apply step, on the git thread: the only place a dream writes to the workspace.

One journalled step: back up, write the edited files, advance `.dream_cursor`, mark note bullets read, commit, then
compact history.jsonl. A failure before the commit rolls every write back; a crash is rolled back (or finished, when the
commit exists) at the next start (`recover_dream_run`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.gitstore.repo import GitStoreError
from nanobotd.gitstore.store import CURSOR_FILE, GitStore
from nanobotd.jobs.compaction import compact_history, compaction_candidates
from nanobotd.jobs.dream.prompts import SKIP_LINE
from nanobotd.jobs.dream.restore import BACKUP_DIR, change_entry
from nanobotd.jobs.dream.tools import ToolRefused
from nanobotd.jobs.dreamnotes import DREAM_NOTES_NAME, mark_dream_notes
from nanobotd.jobs.runfiles import digest, load_backup, read_or_none, save_backup, write_or_delete
from nanobotd.memory.history import DREAM_CURSOR_NAME, read_dream_cursor
from nanobotd.state.store import RunRecord, StateStore

KIND = "dream"
UNDO_SUFFIX = ".undo.tmp"
APPLY_ATTEMPTS = 3  # an agent editing a memory file again and again during the apply step fails the dream


class DreamError(Exception):
    """The dream cannot complete; its message is the outcome's reason."""


class ApplyStep:
    """The apply step of `DreamRun` (which sets workspace, store, git, run_id, memory_dir, manifest, staged,
    on_stage, max_history_entries and provides journal and finish)."""

    def apply(self, cursor_after: int):
        """Write everything the completed batches changed, commit, compact; roll back on any failure."""
        undo = None
        try:
            for _ in range(APPLY_ATTEMPTS):
                contents = self.final_contents()
                # Never move the cursor back, should another dreamer have advanced it meanwhile.
                cursor_after = max(cursor_after, read_dream_cursor(self.memory_dir))
                self.back_up(contents, cursor_after)
                self.journal("applying")
                self.on_stage("applying")
                undo = self.prepare_undo(contents, cursor_after)
                if contents and self.git.available:
                    self.git.snapshot_outside_edits(self.run_id)
                if not self.edited_meanwhile():
                    break
                undo.discard()  # nothing written yet: replay the edits onto the agent's newer text
            else:
                raise DreamError("the agent kept changing the memory files while the dream applied its edits")
            self.write(contents, cursor_after)
            if contents and self.git.available:
                self.manifest["commit"] = self.git.commit(
                    [*contents, CURSOR_FILE], self.commit_summary(contents), self.run_id, notes=self.commit_notes())
            self.on_stage("committed")
            self.journal("committed")
        except (GitStoreError, DreamError, ToolRefused, OSError) as exc:
            logger.error("dream {} of {} could not apply its edits: {}", self.run_id, self.workspace.name, exc)
            try:
                if undo is not None:
                    undo.put_back()
                    self.unstage([*contents, CURSOR_FILE] if contents else [])
                else:
                    roll_back(self.workspace.path, self.manifest)
            except OSError as rollback_error:
                # The run stays "applying" in the journal, so start-up recovery tries again.
                logger.error("rolling back dream {} failed: {}", self.run_id, rollback_error)
                raise
            self.manifest.update(cursor_after=self.manifest["cursor_before"], commit=None, rolled_back=True)
            return self.finish("failed", "error", reason=f"apply failed: {exc}")
        undo.discard()
        self.compact()
        return self.finish("finished", "written" if contents else "no_change")

    def unstage(self, paths: list[str]) -> None:
        """Out of git's index what a failed commit staged; the files are back already, so a failure here only
        leaves them showing as staged (logged)."""
        if paths and self.git.available:
            try:
                self.git.unstage(paths)
            except GitStoreError as exc:
                logger.warning("dream {}: could not unstage {} after its failed commit: {}", self.run_id, paths, exc)

    def prepare_undo(self, contents: dict[str, str], cursor_after: int) -> Undo:
        """Copies of every file the step writes, made before the first write (see Undo)."""
        undo = Undo(self.memory_dir.parent)
        try:
            for path, text in contents.items():
                undo.keep(self.staged.checked_path(path), text.encode("utf-8"))
            undo.keep(self.memory_dir / DREAM_CURSOR_NAME, str(cursor_after).encode("utf-8"))
            if self.manifest["notes_read"]:
                undo.keep(self.memory_dir / DREAM_NOTES_NAME, None)
        except BaseException:
            undo.discard()
            raise
        return undo

    def write(self, contents: dict[str, str], cursor_after: int) -> None:
        """The files, then the cursor, then the note bullets read (roll_back undoes each)."""
        for path, text in contents.items():
            fsio.atomic_write(self.staged.checked_path(path), text, root=self.memory_dir.parent)
        self.on_stage("files_written")
        fsio.atomic_write(self.memory_dir / DREAM_CURSOR_NAME, str(cursor_after), root=self.memory_dir.parent)
        self.manifest["cursor_after"] = cursor_after
        self.on_stage("cursor_written")
        if self.manifest["notes_read"]:
            mark_dream_notes(self.memory_dir, self.manifest["notes_read"], read=True)
        self.on_stage("notes_written")

    def compact(self) -> None:
        """Compact history.jsonl once the dream is committed; a failure is logged, the dream still stands."""

        def journal_removal(removal: dict) -> None:
            self.manifest["history_compacted"] = removal
            self.journal("compacting")

        try:
            cursors = compaction_candidates(self.memory_dir, self.max_history_entries)
            compact_history(self.memory_dir, self.store.run_dir(self.run_id), cursors, journal_removal)
        except (OSError, fsio.LockTimeout) as exc:
            logger.warning("history compaction after dream {} failed: {}", self.run_id, exc)

    def final_contents(self) -> dict[str, str]:
        """The edited texts; edits are replayed onto a file the agent changed during the run."""
        contents, self.replayed_onto = {}, {}
        for path, (base, text) in self.staged.changes().items():
            full = self.staged.checked_path(path)
            current = full.read_bytes() if full.exists() else None
            self.replayed_onto[path] = current
            if current != base:
                try:
                    text = self.staged.replay(path, (current or b"").decode("utf-8"))
                except (ToolRefused, UnicodeDecodeError) as exc:
                    raise DreamError(f"{path} changed during the dream and the edits no longer apply") from exc
            contents[path] = text
        return contents

    def edited_meanwhile(self) -> bool:
        """Whether a file changed since final_contents read it (the agent writes its memory files in place, at
        any time): writing the texts made from the older version would drop the agent's edit."""
        return any(read_or_none(self.staged.checked_path(path)) != before
                   for path, before in self.replayed_onto.items())

    def back_up(self, contents: dict[str, str], cursor_after: int) -> None:
        """Save the pre-run content of every file to be written into the run's folder, and plan the manifest."""
        backup_dir = self.store.run_dir(self.run_id) / BACKUP_DIR
        for path, text in contents.items():
            before = (self.workspace.path / path).read_bytes()
            self.manifest["files_changed"][path] = change_entry(
                before, text.encode("utf-8"), save_backup(backup_dir, path, before))
        cursor_bytes = read_or_none(self.memory_dir / DREAM_CURSOR_NAME)
        self.manifest["cursor_backup"] = save_backup(backup_dir, CURSOR_FILE, cursor_bytes)
        self.manifest["cursor_written"] = str(cursor_after)

    def commit_summary(self, contents: dict[str, str]) -> str:
        """The commit's first line after `dream: `."""
        count = len([line for line in self.manifest["analysis"] if line != SKIP_LINE])
        condensed = ", condensed" if condensed_files(self.manifest) else ""
        return f"update {', '.join(contents)} ({count} finding{'s' if count != 1 else ''}{condensed})"

    def commit_notes(self) -> str:
        """The analysis, the cursor move and the note bullets read, for the commit body."""
        cursor_line = f"Dream cursor: {self.manifest['cursor_before']} -> {self.manifest['cursor_after']}"
        if self.manifest["entries"]:
            first, last = self.manifest["entries"]
            cursor_line += f" (history entries {first}-{last})"
        lines = ["Analysis:", *self.manifest["analysis"], "", cursor_line]
        notes = self.manifest["notes_read"]
        if notes:
            lines.append("Daily notes read: " + ", ".join(
                f"{day} ({len(digests)} bullet{'s' if len(digests) != 1 else ''})" for day, digests in notes.items()))
        shrunk = condensed_files(self.manifest)
        if shrunk:
            lines.append("Condensed (over the caps): " + ", ".join(shrunk))
        if self.manifest.get("stopped"):
            lines.append(f"Stopped early ({self.manifest['stopped']}); left: {describe_left(self.manifest['left'])}")
        return "\n".join(lines)


class Undo:
    """Each written file's old content, copied beside it first: putting it back is a rename needing no free space, so a
    full disk failing a dream cannot fail its roll-back. Put back only while it holds what the step wrote."""

    def __init__(self, root: Path):
        self.root = root
        self.kept: list[tuple[Path, Path | None, bytes | None]] = []  # (file, copy of its old content, written)

    def keep(self, path: Path, written: bytes | None) -> None:
        """Copy *path* (absent: remember that) before the step writes *written* (None: put back whatever it holds)."""
        path = fsio.confine(path, self.root)
        if not path.is_file():
            self.kept.append((path, None, written))
            return
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=UNDO_SUFFIX, dir=path.parent)
        self.kept.append((path, Path(name), written))  # listed first, so a failed copy is removed with the rest
        with os.fdopen(fd, "wb") as handle:
            handle.write(path.read_bytes())
            handle.flush()
            os.fsync(handle.fileno())

    def put_back(self) -> None:
        """Every kept file as it was, except one that changed since the step wrote it (logged)."""
        folders = set()
        for path, copy, written in self.kept:
            current = read_or_none(path)
            if written is not None and current not in (None, written, read_or_none(copy) if copy else None):
                logger.warning("not rolling back {}: it changed after the dream wrote it", path)
                continue
            if copy is None:
                path.unlink(missing_ok=True)
            else:
                os.replace(copy, path)
            folders.add(path.parent)
        for folder in folders:
            fsio.fsync_dir(folder)
        self.discard()

    def discard(self) -> None:
        """Remove the copies (the step committed, or they were put back)."""
        for _, copy, _ in self.kept:
            if copy is not None:
                copy.unlink(missing_ok=True)
        self.kept = []


def describe_left(left: dict) -> str:
    """What a run that stopped early left for the next one, in words."""
    return f"{left.get('history_entries', 0)} history entries, {left.get('note_bullets', 0)} note bullets"


def condensed_files(manifest: dict) -> list[str]:
    """The files a kept condensing pass shortened, as "PATH BEFORE -> AFTER characters"."""
    condensed = manifest.get("condensed") or {}
    before, after = condensed.get("before", {}), condensed.get("after") or {}
    return [f"{path} {before[path]:,} -> {size:,} characters" for path, size in after.items()
            if path in before and size != before[path]]


def recover_dream_run(run: RunRecord, *, store: StateStore, git: GitStore) -> str:
    """Close a dream run left "started" by a crash: finish it if committed, else roll it back. On the calling thread:
    recovery happens at start-up, before any other git work."""
    if not git.opened:
        # Whether the run's commit exists decides between finishing and rolling back.
        git.open()
    manifest = dict(run.manifest)
    stage = manifest.get("stage")
    manifest["recovered"] = True
    if stage == "applying" and git.available:
        try:
            manifest["commit"] = git.find_commit_for_run(run.run_id)
        except GitStoreError as exc:
            logger.warning("could not look for the commit of run {}: {}", run.run_id, exc)
        if manifest.get("commit"):
            stage = "committed"
    for folder in (git.workspace, git.workspace / "memory"):  # the apply step's own undo copies, of no use now
        for copy in folder.glob(f".*{UNDO_SUFFIX}"):
            copy.unlink(missing_ok=True)
    if stage in ("committed", "compacting"):
        outcome = "written" if manifest.get("files_changed") else "no_change"
        store.finish_run(run.run_id, state="finished", outcome=outcome, manifest=manifest)
        return "finished"
    if stage == "applying":
        manifest["left_alone"] = roll_back(git.workspace, manifest)
        manifest["cursor_after"] = manifest.get("cursor_before")
        store.record_outcome(KIND, run.workspace, "error", run_id=run.run_id, reason="interrupted; rolled back")
        store.finish_run(run.run_id, state="rolled_back", outcome="rolled_back", manifest=manifest)
        return "rolled_back"
    store.record_outcome(KIND, run.workspace, "error", run_id=run.run_id, reason="interrupted")
    store.finish_run(run.run_id, state="failed", outcome="interrupted", manifest=manifest)
    return "failed"


def roll_back(workspace: Path, manifest: dict) -> list[str]:
    """Put back the pre-run content of files a run wrote (and the cursor); return files left alone: those no longer
    holding exactly what the run wrote, so an edit the agent made after a crash is never overwritten."""
    left_alone = []
    for path, info in manifest.get("files_changed", {}).items():
        full = workspace / path
        backup = load_backup(info.get("backup"))
        current = read_or_none(full)
        if current == backup:
            continue
        if current is not None and digest(current) != info.get("after_sha256"):
            logger.warning("not rolling back {}: it changed after the run wrote it", full)
            left_alone.append(path)
            continue
        write_or_delete(full, backup, root=workspace)
    if "cursor_backup" in manifest:
        cursor_path = workspace / CURSOR_FILE
        current = read_or_none(cursor_path)
        if current is not None and current.decode("utf-8", "replace") == manifest.get("cursor_written"):
            write_or_delete(cursor_path, load_backup(manifest["cursor_backup"]), root=workspace)
    if manifest.get("notes_read"):
        # The run read only bullets that were unread when it began, so unmarking them undoes exactly its mark.
        mark_dream_notes(workspace / "memory", manifest["notes_read"], read=False)
    return left_alone
