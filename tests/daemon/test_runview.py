"""nanobotd/daemon/runview.py: what each kind of run changed and how far it has got, read from its manifest."""

from __future__ import annotations

from nanobotd.daemon import runview
from nanobotd.state.store import RunRecord


def record(kind: str, manifest: dict, *, state: str = "finished", outcome: str = "written") -> RunRecord:
    return RunRecord("r-1", kind, "ws", None, state, outcome, 100.0, 102.5 if state == "finished" else None,
                     manifest)


def test_each_kind_reports_its_entries_files_and_commits() -> None:
    assert runview.changes(record("consolidate", {"chunks": [{"done": True, "count": 6}, {"done": False, "count": 9}],
                                                  "cursors": [3, 4]})) == {
        "entries_added": 2, "messages_archived": 6, "files": ["memory/history.jsonl"], "commits": []}
    assert runview.changes(record("dream", {"files_changed": {"USER.md": {}}, "commit": "abc",
                                            "history_compacted": {"removed": 0}})) == {
        "files": ["USER.md"], "commits": ["abc"]}
    assert runview.changes(record("flush", {"note": "/w/memory/2026-11-20.md",
                                            "added_bullets": {"Decisions": ["a", "b"]}})) == {
        "bullets_added": 2, "files": ["memory/2026-11-20.md"], "commits": []}
    lifecycle = {"executed": [{"action": "move", "from": "memory/2026-11-01.md", "to": "memory/archive/x.md"}],
                 "history_added": [9], "history_removed": None, "pruned": []}
    assert runview.changes(record("lifecycle", lifecycle)) == {
        "entries_added": 1, "notes_moved": 1, "files": ["memory/2026-11-01.md", "memory/history.jsonl"],
        "commits": []}
    assert runview.changes(record("restore", {"removed_entries": [{}], "messages": 6, "files": []}))[
        "messages_unarchived"] == 6
    assert runview.changes(record("reindex", {"stats": {"units_added": 40, "files_reindexed": 3}})) == {
        "units_indexed": 40, "files_indexed": 3, "files": [], "commits": []}


def test_progress_is_shown_for_open_runs_only() -> None:
    running = record("consolidate", {"progress": {"step": "archiving", "done": 1, "total": 3}}, state="started")
    assert runview.progress(running, "running", now=103.0) == {
        "phase": "running", "step": "archiving", "done": 1, "total": 3, "elapsed_seconds": 3.0}
    assert runview.progress(record("dream", {"stage": "analysing"}, state="queued"), None, now=100.0) == {
        "phase": "queued", "step": "analysing", "elapsed_seconds": 0.0}
    assert runview.progress(record("consolidate", {}), None, now=200.0) is None


def test_a_consolidations_reason_is_its_trigger() -> None:
    data = runview.run_json(record("consolidate", {"reason": "manual"}, outcome="no_change"), phase=None, now=0)
    assert data["trigger"] == "manual" and "reason" not in data and data["duration_seconds"] == 2.5


def test_a_running_consolidation_counts_the_entries_of_its_done_chunks() -> None:
    # while it runs, its journal holds chunks (steps) and no `cursors` list (state.runsteps)
    running = record("consolidate", {"chunks": [{"done": True, "count": 6, "cursors": [3, 4]},
                                                {"done": False, "count": 9, "cursors": [5]}]}, state="started")
    assert runview.changes(running) == {"entries_added": 2, "messages_archived": 6,
                                        "files": ["memory/history.jsonl"], "commits": []}
