"""A state folder lost between two runs of the daemon: history.jsonl says what was archived, nothing twice."""

from __future__ import annotations

import shutil
import time

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


def test_a_consolidate_asked_for_before_the_marks_are_rebuilt_waits_for_them(tmp_path, daemon_process):
    """The first scan of a wiped state folder knows the session before history has said what was archived: a run
    asked for then waits for the marks, or it would archive everything again."""
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace)
    messages = conversation(3000, tag="a", words=30)
    write_session(sessions, "cli:a", messages[:2000])
    daemon.start()
    daemon.wait_reconciled()
    daemon.ctl("consolidate", "cli:a")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    daemon.stop()
    shutil.rmtree(daemon.state_dir)
    write_session(sessions, "cli:a", messages)
    release = tmp_path / "release"
    daemon.env["NANOBOTD_FAULTS"] = f"reconcile.startup_scanned=hold:{release}"  # scanned, marks not rebuilt
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:a") is not None)
    run_id = daemon.ctl_json("consolidate", "--no-wait", "cli:a")["run_id"]
    time.sleep(1)  # time enough for a run that did not wait to archive what it found
    assert daemon.ctl_json("run", run_id)["run"]["state"] != "finished"
    release.touch()
    daemon.wait_for(lambda: "rebuilt 2000 archive marks" in daemon.log())
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    markers = archived_markers(workspace)
    assert sorted(set(markers)) == sorted({f"A-{index} " for index in range(3000)})
    assert len(markers) == 3000, "messages archived twice"
