"""nanobotd/cli/runtext.py: a run's summary, its detail and its progress, from the daemon's run records."""

from __future__ import annotations

from nanobotd.cli import runtext

RESTORE = {"run_id": "r-2", "kind": "restore", "state": "finished", "outcome": "restored", "duration_seconds": 0.043,
           "target": "r-1", "target_kind": "consolidate",
           "changes": {"entries_removed": 1, "messages_unarchived": 30, "files": ["memory/history.jsonl"],
                       "commits": []},
           "manifest": {"plan": ["remove history entries with cursors [1]"],
                        "removed_entries": [{"cursor": 1, "content": "[RAW] ..." * 500}]}}


def test_a_restore_sums_up_what_it_undid_and_changed() -> None:
    assert runtext.summary_lines(RESTORE) == [
        "restore r-2: restored in 0.04s",
        "  undid:                   consolidate run r-1",
        "  history entries removed: 1",
        "  messages unarchived:     30",
        "  files:                   memory/history.jsonl",
        "Details: nanobotctl run r-2",
    ]


def test_the_detail_of_a_run_names_its_steps_and_never_dumps_the_manifest() -> None:
    lines = runtext.detail_lines(RESTORE)
    assert lines[0] == "run r-2" and "  steps:" in lines
    assert "    remove history entries with cursors [1]" in lines
    assert not [line for line in lines if "[RAW]" in line]


def test_a_run_that_changed_nothing_says_so_and_offers_no_undo() -> None:
    lines = runtext.summary_lines({"run_id": "r-3", "kind": "consolidate", "state": "finished",
                                   "outcome": "no_change", "duration_seconds": 0.001, "changes": {}})
    assert lines == ["consolidate r-3: no_change in 0.00s", "  changed: nothing", "Details: nanobotctl run r-3"]


def test_progress_reads_phase_then_step_n_of_m_then_time() -> None:
    run = {"state": "started", "progress": {"phase": "running", "step": "archiving", "done": 1, "total": 4,
                                            "elapsed_seconds": 3.0}}
    assert runtext.progress_text(run) == "running, archiving 2/4, 3.00s"
    assert runtext.progress_text(run, elapsed=75) == "running, archiving 2/4, 1m 15s"
    assert runtext.progress_text({"state": "queued", "progress": {"phase": "waiting_for_llm"}}) == \
        "waiting for an LLM slot"
