"""The state folder's disk fills while a consolidation runs (a real tmpfs), after its history was appended and before
its archive marks are written: the run is recovered as after a crash once there is room (a failed run, its appended
messages marked), and none of them is archived again by the next run. A run asked for meanwhile is refused as a full
disk, not as an internal error. A reload meanwhile completes, and a run it could not close is closed when its
workspace is back."""

from __future__ import annotations

import re
import signal
from collections import Counter

from tests.support.mounts import tmpfs
from tests.support.workspace import conversation, make_workspace, write_session

KEY = "cli:full"
OTHER = "cli:other"
COUNT = 60


def fill(folder) -> None:
    """Write to *folder* until its disk has no room left."""
    try:
        with open(folder / "filler", "wb") as handle:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
    except OSError:
        pass


def test_a_run_that_fails_on_a_full_disk_is_recovered_once_there_is_room_and_nothing_is_archived_twice(
        tmp_path, daemon_process):
    release = tmp_path / "release"
    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, KEY, conversation(COUNT))
    write_session(sessions, OTHER, conversation(4))
    with tmpfs(tmp_path / "state", "16m") as state:
        daemon = daemon_process(workspace, env={"NANOBOTD_FAULTS": f"consolidate.appended=hold:{release}"})
        daemon.start()
        daemon.wait_for(lambda: daemon.session(KEY))
        run_id = daemon.ctl_json("consolidate", KEY, "--no-wait")["run_id"]
        daemon.wait_for(lambda: "fault point consolidate.appended: holding" in daemon.log())
        fill(state)  # the history is appended; what the run writes to the state from here on meets a full disk
        release.touch()
        daemon.wait_for(lambda: f"consolidate job {run_id} failed: database or disk is full" in daemon.log())
        assert daemon.ctl_json("run", run_id)["run"]["state"] == "started"  # its end could not be written either
        refused = daemon.ctl("consolidate", OTHER, "--no-wait")
        assert refused.returncode == 1 and "Free space on that disk" in refused.stderr, refused.stderr
        assert "internal error" not in refused.stderr
        (state / "filler").unlink()

        run = daemon.wait_for(lambda: (daemon.ctl_json("run", run_id)["run"] or {}).get("state") != "started" and
                              daemon.ctl_json("run", run_id)["run"], timeout=30)
        assert (run["state"], run["outcome"]) == ("failed", "error") and "full" in run["manifest"]["error"]
        assert run["manifest"]["recovery"] == {"finished_chunks": 1, "rolled_back_chunks": 0}
        daemon.ctl("consolidate", KEY)
        history = (workspace / "memory" / "history.jsonl").read_text()
        counts = Counter(re.findall(r"\bM-(\d+) ", history))
        assert sorted(map(int, counts)) == list(range(COUNT)) and set(counts.values()) == {1}
        daemon.kill()



def test_a_reload_removing_a_workspace_on_a_full_disk_completes_and_its_failed_run_is_recovered_when_it_is_back(
        tmp_path, daemon_process):
    release = tmp_path / "release"
    first, _ = make_workspace(tmp_path)
    workspace, sessions = make_workspace(tmp_path / "two", layout="current")
    write_session(sessions, KEY, conversation(COUNT))
    with tmpfs(tmp_path / "state", "16m") as state:
        daemon = daemon_process(first, env={"NANOBOTD_FAULTS": f"consolidate.appended=hold:{release}"})
        alone = daemon.config_path.read_text()
        both = alone + f'\n[[workspaces]]\npath = "{workspace}"\nname = "two"\nconsolidation = {{ mode = "owner" }}\n'
        daemon.config_path.write_text(both)
        daemon.start()
        daemon.wait_for(lambda: daemon.api("/v1/sessions/cli%3Afull?workspace=two"))
        run_id = daemon.ctl_json("--workspace", "two", "consolidate", KEY, "--no-wait")["run_id"]
        daemon.wait_for(lambda: "fault point consolidate.appended: holding" in daemon.log())
        fill(state)
        release.touch()
        daemon.wait_for(lambda: f"consolidate job {run_id} failed: database or disk is full" in daemon.log())
        reload(daemon, alone, 1)  # its recovery cannot be written: the run stays open, the reload completes
        daemon.wait_for(lambda: "its workspace was removed, it is recovered when it is back" in daemon.log())
        (state / "filler").unlink()
        reload(daemon, both, 2)
        assert daemon.ctl_json("run", run_id)["run"]["state"] == "finished"
        daemon.ctl("--workspace", "two", "consolidate", KEY)
        history = (workspace / "memory" / "history.jsonl").read_text()
        counts = Counter(re.findall(r"\bM-(\d+) ", history))
        assert sorted(map(int, counts)) == list(range(COUNT)) and set(counts.values()) == {1}
        daemon.kill()


def reload(daemon, config: str, reloads: int) -> None:
    daemon.config_path.write_text(config)
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: daemon.log().count("config reloaded") >= reloads)
