"""What a run changed and how far it has got, read from its ledger record for people and for the log.

Each job kind writes its own manifest; this module reads them once, per kind, so `nanobotctl`, the
control API and the daemon's log line at the end of a run all tell the same story.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nanobotd.jobs.consolidate.archive import chunk_cursors
from nanobotd.state.store import RunRecord

HISTORY_FILE = "memory/history.jsonl"
DREAM_CURSOR_FILE = "memory/.dream_cursor"
CHANGE_LABELS = (("entries_added", "history entries added"), ("entries_removed", "history entries removed"),
                 ("messages_archived", "messages archived"), ("messages_unarchived", "messages unarchived"),
                 ("bullets_added", "bullets added"), ("notes_moved", "notes moved"),
                 ("notes_deleted", "notes deleted"), ("backups_pruned", "run backups pruned"),
                 ("files_indexed", "files indexed"), ("units_indexed", "search units indexed"),
                 ("dream_cursor", "dream cursor"))


def changes(run: RunRecord) -> dict:
    """Counts of what the run changed (only the non-zero ones), the files it wrote and its commits."""
    reader = CHANGE_READERS.get(run.kind)
    found: dict[str, Any] = reader(run.manifest) if reader is not None else {}
    counts = {key: value for key, value in found.items() if key not in ("files", "commits") and value}
    files = sorted({str(path) for path in found.get("files") or [] if path})
    commits = [str(sha) for sha in found.get("commits") or [] if sha]
    return {**counts, "files": files, "commits": commits}


def progress(run: RunRecord, phase: str | None, now: float) -> dict | None:
    """Where an open run is: queued, waiting for an LLM slot, or running (with the job's own step n/m)."""
    if run.state not in ("queued", "started"):
        return None
    reported = run.manifest.get("progress") if isinstance(run.manifest.get("progress"), dict) else {}
    step = reported.get("step") or run.manifest.get("stage")
    data = {"phase": phase or run.state, "step": step, "done": reported.get("done"), "total": reported.get("total"),
            "elapsed_seconds": round(max(0.0, now - run.started_at), 1)}
    return {key: value for key, value in data.items() if value is not None}


def duration(run: RunRecord) -> float | None:
    """Seconds from start to end of a finished run."""
    return round(run.finished_at - run.started_at, 3) if run.finished_at else None


def run_json(run: RunRecord, *, phase: str | None, now: float, with_manifest: bool = True) -> dict:
    """The ledger record with its duration, progress and changes, as GET /v1/runs/{id} answers it."""
    data = run.to_json(with_manifest=with_manifest)
    data["duration_seconds"] = duration(run)
    data["progress"] = progress(run, phase, now)
    data["changes"] = changes(run)
    for key in ("reason", "error", "target", "target_kind"):
        if isinstance(run.manifest.get(key), str) and run.manifest[key]:
            data.setdefault(key, run.manifest[key])
    if run.kind == "consolidate" and "reason" in data:
        data["trigger"] = data.pop("reason")  # why it ran (budget, idle, manual), not why it ended so
    return data


def describe_changes(found: dict) -> str:
    """"history entries added: 1, messages archived: 30, files: memory/history.jsonl": for the log line."""
    parts = [f"{label}: {found[key]}" for key, label in CHANGE_LABELS if found.get(key)]
    if found.get("files"):
        parts.append("files: " + " ".join(found["files"]))
    if found.get("commits"):
        parts.append("commits: " + " ".join(sha[:12] for sha in found["commits"]))
    return ", ".join(parts) or "nothing changed"


def end_line(run: RunRecord) -> str:
    """The log line of a run that ended: what, where, how it went, how long, what changed."""
    session = f" session {run.session_key}" if run.session_key else ""
    seconds = duration(run)
    took = f" in {seconds:.2f}s" if seconds is not None else ""
    return (f"run {run.run_id} ({run.kind}, workspace {run.workspace}{session}) {run.state}: "
            f"{run.outcome or '-'}{took}; {describe_changes(changes(run))}")


# -- per kind ---------------------------------------------------------------------------------------

def _consolidate(manifest: dict) -> dict:
    done = [chunk for chunk in manifest.get("chunks") or [] if isinstance(chunk, dict) and chunk.get("done")]
    # a running consolidation journals no `cursors` (its chunks hold them: state.runsteps)
    entries = len((manifest.get("cursors") if "cursors" in manifest else chunk_cursors(manifest)) or [])
    return {"entries_added": entries, "messages_archived": sum(int(chunk.get("count") or 0) for chunk in done),
            "files": [HISTORY_FILE] if entries else []}


def _flush(manifest: dict) -> dict:
    bullets = sum(len(items) for items in (manifest.get("added_bullets") or {}).values())
    return {"bullets_added": bullets, "files": [_relative_note(manifest.get("note"))] if bullets else []}


def _dream(manifest: dict) -> dict:
    compacted = manifest.get("history_compacted") or {}
    removed = int(compacted.get("removed") or 0) if isinstance(compacted, dict) else 0
    files = list(manifest.get("files_changed") or {})
    before, after = manifest.get("cursor_before"), manifest.get("cursor_after")
    moved = isinstance(before, int) and isinstance(after, int) and after != before
    cursor = None
    if moved:  # a dream that read entries with nothing new for the memory files moves only its cursor: say so
        cursor = f"{before} -> {after}" + ("" if files else " only (no memory file changed: the entries read "
                                                            "held nothing new for them)")
    return {"entries_removed": removed, "dream_cursor": cursor,
            "files": files + ([HISTORY_FILE] if removed else []) + ([DREAM_CURSOR_FILE] if moved else []),
            "commits": [manifest.get("commit")]}


def _lifecycle(manifest: dict) -> dict:
    executed = [step for step in manifest.get("executed") or [] if isinstance(step, dict)]
    removed = manifest.get("history_removed") or {}
    added = len(manifest.get("history_added") or [])
    removed_count = int(removed.get("removed") or 0) if isinstance(removed, dict) else 0
    files = [step.get("from") for step in executed if step.get("action") == "move"]
    files += [step.get("path") for step in executed if step.get("action") == "delete"]
    return {"entries_added": added, "entries_removed": removed_count,
            "notes_moved": sum(step.get("action") == "move" for step in executed),
            "notes_deleted": sum(step.get("action") == "delete" for step in executed),
            "backups_pruned": len(manifest.get("pruned") or []),
            "files": files + ([HISTORY_FILE] if added or removed_count else [])}


def _restore(manifest: dict) -> dict:
    removed = len(manifest.get("removed_entries") or [])
    restored = manifest.get("history_restored")
    added = int(manifest.get("reinserted") or 0) + (len(restored) if isinstance(restored, list) else int(restored or 0))
    files = list(manifest.get("files") or [])
    return {"entries_added": added, "entries_removed": removed,
            "messages_unarchived": int(manifest.get("messages") or 0),
            "files": files + ([HISTORY_FILE] if added or removed else []), "commits": [manifest.get("commit")]}


def _reindex(manifest: dict) -> dict:
    stats = manifest.get("stats") if isinstance(manifest.get("stats"), dict) else {}
    return {"units_indexed": int(stats.get("units_added") or 0),
            "files_indexed": int(stats.get("files_reindexed") or 0)}


def _relative_note(note: Any) -> str:
    text = str(note or "")
    return text[text.rfind("memory/"):] if "memory/" in text else text


CHANGE_READERS: dict[str, Callable[[dict], dict]] = {
    "consolidate": _consolidate, "flush": _flush, "dream": _dream, "lifecycle": _lifecycle,
    "restore": _restore, "reindex": _reindex,
}
