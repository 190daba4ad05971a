"""A state folder lost between two runs of the daemon: history.jsonl says what was archived, nothing twice."""

from __future__ import annotations

import shutil

from tests.support.histories import archived_markers
from tests.support.workspace import conversation, make_workspace, write_session


def test_a_wiped_state_folder_archives_nothing_twice_over_budget(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace)
    messages = conversation(8000, tag="a", words=30)
    write_session(sessions, "cli:a", messages[:6000])
    daemon.start()
    daemon.wait_reconciled()
    daemon.ctl("consolidate", "cli:a")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    archived = len(archived_markers(workspace))
    assert archived == 6000
    daemon.stop()
    shutil.rmtree(daemon.state_dir)  # the user wipes the state folder; the session is over budget again at once
    write_session(sessions, "cli:a", messages)
    daemon.start()
    daemon.wait_for(lambda: "rebuilt 6000 archive marks" in daemon.log())
    daemon.ctl("consolidate", "cli:a")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    markers = archived_markers(workspace)
    assert sorted(set(markers)) == sorted({f"A-{index} " for index in range(8000)})
    assert len(markers) == 8000, "messages archived twice"
