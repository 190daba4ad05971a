"""nanobotd/daemon/workspace.py: a long scan counts in the counting process, which is let go once it is done."""

from __future__ import annotations

import asyncio
from datetime import datetime

from nanobotd.config.schema import WorkspaceSettings
from nanobotd.daemon.workspace import Workspace
from nanobotd.state.store import StateStore
from nanobotd.tokenprocess import CountingProcess
from tests.support.workspace import conversation, make_workspace, write_session


def test_a_long_scan_counts_in_the_counting_process_and_lets_it_go_when_done(tmp_path):
    workspace, sessions = make_workspace(tmp_path / "ws")
    store = StateStore(tmp_path / "state").open()
    runtime = Workspace(WorkspaceSettings(path=workspace, name="ws", sessions_dir=sessions), store,
                        state_dir=tmp_path / "state", environ={}, home=None, now=datetime.now)
    try:
        runtime.counting.close()
        runtime.counting = CountingProcess(after_texts=1)
        runtime.tracker.counter = runtime.counting.submit
        runtime.tracker.process_scan_bytes = 10_000
        path = write_session(sessions, "cli:long", conversation(300, tag="l"))
        result = runtime.scan_path(path)
        assert result.new_messages == 300 and runtime.tracker.sessions["cli:long"].unarchived_tokens > 0
        assert runtime.counting.starts == 1 and not runtime.counting.running
        write_session(sessions, "cli:other", conversation(300, tag="o"))
        runtime.reconcile()
        assert runtime.counting.starts == 2 and not runtime.counting.running
        assert runtime.tracker.sessions["cli:other"].message_count == 300
    finally:
        asyncio.run(runtime.close())
        store.close()
