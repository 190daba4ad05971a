"""A state folder lost between two runs of the daemon: history.jsonl says what was archived, nothing twice."""

from __future__ import annotations

import shutil
import time

from tests.support.histories import archived_markers
from tests.support.workspace import conversation, make_workspace, write_session


def archived_then_wiped(tmp_path, daemon_process, archived: int, total: int, *, env: dict | None = None):
    """A daemon that archived the first *archived* of *total* messages of cli:a, then lost its state folder (the
    user wiped it) while the session grew to *total*: it starts again with *env* added. Returns (workspace,
    daemon)."""
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace)
    messages = conversation(total, tag="a", words=30)
    write_session(sessions, "cli:a", messages[:archived])
    daemon.start()
    daemon.wait_reconciled()
    daemon.ctl("consolidate", "cli:a")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    assert len(archived_markers(workspace)) == archived
    daemon.stop()
    shutil.rmtree(daemon.state_dir)
    write_session(sessions, "cli:a", messages)
    daemon.env.update(env or {})
    daemon.start()
    return workspace, daemon


def assert_archived_once(workspace, total: int) -> None:
    markers = archived_markers(workspace)
    assert sorted(set(markers)) == sorted({f"A-{index} " for index in range(total)})
    assert len(markers) == total, "messages archived twice"


def test_a_wiped_state_folder_archives_nothing_twice_over_budget(tmp_path, daemon_process):
    workspace, daemon = archived_then_wiped(tmp_path, daemon_process, 6000, 8000)  # over budget again at once
    daemon.wait_for(lambda: "rebuilt 6000 archive marks" in daemon.log())
    daemon.ctl("consolidate", "cli:a")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    assert_archived_once(workspace, 8000)


def test_a_consolidate_asked_for_before_the_marks_are_rebuilt_waits_for_them(tmp_path, daemon_process):
    """The first scan of a wiped state folder knows the session before history has said what was archived: a run
    asked for then waits for the marks, or it would archive everything again."""
    release = tmp_path / "release"
    workspace, daemon = archived_then_wiped(  # held once scanned, before the marks are rebuilt
        tmp_path, daemon_process, 2000, 3000, env={"NANOBOTD_FAULTS": f"reconcile.startup_scanned=hold:{release}"})
    daemon.wait_for(lambda: daemon.session("cli:a") is not None)
    run_id = daemon.ctl_json("consolidate", "--no-wait", "cli:a")["run_id"]
    time.sleep(1)  # time enough for a run that did not wait to archive what it found
    assert daemon.ctl_json("run", run_id)["run"]["state"] != "finished"
    release.touch()
    daemon.wait_for(lambda: "rebuilt 2000 archive marks" in daemon.log())
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 0, timeout=60)
    assert_archived_once(workspace, 3000)
