"""SIGKILL a real daemon at each step of a budget run that archives a long unread session as it reads its held copy:
after the next start every message is in history once, nothing is left in the spool or held, and the run that was
cut short can still be restored."""

from __future__ import annotations

import pytest

from nanobotd.faults import ENV_NAME
from tests.e2e.test_unread import (
    OWNER_CONFIG,
    archive_all,
    assert_archived_once,
    held_files,
    key_of,
    spooled_rows,
    state_query,
    unread,
    wait_killed,
)
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

COUNT = 400  # ~40 words each: ~150 KB, held unread at start, over the budget and tens of chunks of 1,000 tokens
# the pass's steps, in its order: a group's cursors journalled (history not written: rolled back), its entries
# appended (not marked: finished), a batch of chunks marked with the session still unread, the tail it leaves spooled
# (not committed), the read committed (the run not closed)
POINTS = ("consolidate.journalled", "consolidate.appended", "consolidate.marked", "scan.read_held", "consolidate.read")


@pytest.mark.parametrize("point", POINTS)
def test_a_sigkill_as_a_budget_run_archives_an_unread_session_loses_and_doubles_nothing(tmp_path, daemon_process,
                                                                                        point):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, key_of("a"), conversation(COUNT, words=40, tag="a"))
    daemon = daemon_process(workspace, extra_config=OWNER_CONFIG)
    daemon.env[ENV_NAME] = f"{point}=kill"  # the budget run the first scan starts meets it
    daemon.start(wait=False)
    wait_killed(daemon)
    assert unread(daemon) == {key_of("a"): 1} or point == "consolidate.read"
    assert spooled_rows(daemon) == 0 or point == "consolidate.read", "the pass spooled what it archived"

    daemon.start()
    assert "was interrupted; recovery" in daemon.log()
    archive_all(daemon, ["a"])
    assert unread(daemon) == {key_of("a"): 0} and spooled_rows(daemon) == 0
    assert held_files(daemon) == [], "a held copy outlived its last unarchived message"
    assert_archived_once(workspace, {"a": COUNT})

    runs = state_query(daemon, "SELECT run_id FROM runs WHERE kind='consolidate' ORDER BY started_at")
    cut_short = runs[0][0]
    restored = daemon.ctl("restore", cut_short, "--wait", timeout=60)
    assert restored.returncode == 0, restored.stderr + daemon.log()[-3000:]
    archive_all(daemon, ["a"])
    assert daemon.stop() == 0
    assert_archived_once(workspace, {"a": COUNT})
    assert history_entries(workspace)
