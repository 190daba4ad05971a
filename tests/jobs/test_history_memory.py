"""Nothing nanobotd does with history.jsonl holds the whole file: peak memory on a ~50 MB history.

The peaks are Python's own allocations (tracemalloc), which do not depend on the machine's load, so the
bound can be tight: a tenth of the file would already fail a reader that keeps every entry (it holds more
than the file's size), while the streamed readers stay near one line plus small per-entry integers.
"""

from __future__ import annotations

from tests.support.bighistory import measure

MIN_SIZE, MAX_SIZE = 40_000_000, 60_000_000
PEAK_LIMIT = 5_000_000  # bytes; measured peaks stay under ~1 MB, the file is ~50 MB


def test_compaction_recovery_marks_backlog_and_audit_stream_a_large_history(tmp_path):
    size, measured = measure(tmp_path)
    assert MIN_SIZE <= size <= MAX_SIZE
    results = {name: result for name, (result, _, _) in measured.items()}
    assert results["compaction_candidates"] == results["compact_history"] > 0
    assert results["recover_consolidation"] == "recovered"
    assert results["rebuild_archive_marks"] == 0
    assert results["read_backlog"] > 0
    assert results["audit"] > 0
    peaks = {name: peak for name, (_, peak, _) in measured.items()}
    assert all(peak < PEAK_LIMIT for peak in peaks.values()), peaks
