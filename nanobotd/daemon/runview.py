"""What a run changed and how far it has got, read from its ledger record for people and for the log. Each kind reads
its own manifest (`Job.changes`), so `nanobotctl`, the API and the end-of-run log line tell the same story."""

from __future__ import annotations

from typing import Any

from nanobotd.jobs.registry import JOB_KINDS
from nanobotd.state.store import RunRecord

CHANGE_LABELS = (("entries_added", "history entries added"), ("entries_removed", "history entries removed"),
                 ("messages_archived", "messages archived"), ("messages_unarchived", "messages unarchived"),
                 ("bullets_added", "bullets added"), ("notes_moved", "notes moved"),
                 ("notes_deleted", "notes deleted"), ("backups_pruned", "run backups pruned"),
                 ("files_indexed", "files indexed"), ("units_indexed", "search units indexed"),
                 ("dream_cursor", "dream cursor"))


def changes(run: RunRecord) -> dict:
    """Counts of what the run changed (only the non-zero ones), the files it wrote and its commits."""
    job = JOB_KINDS.get(run.kind)
    found: dict[str, Any] = job.changes(run.manifest) if job is not None else {}
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
    trigger_key = JOB_KINDS[run.kind].trigger_key if run.kind in JOB_KINDS else None
    if trigger_key and trigger_key in data:
        data["trigger"] = data.pop(trigger_key)  # why it ran (budget, idle, manual), not why it ended so
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
