"""Restore through a real daemon: a target that names nothing queues nothing."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.workspace import make_workspace


@pytest.mark.parametrize("target", ["0000", "r-20260101-000000-consolidate-abcdef",
                                    "the sha of a commit that is not a dream"])
def test_restoring_a_name_that_is_no_run_and_no_dream_commit_queues_nothing(tmp_path, daemon_process, target):
    workspace, _ = make_workspace(tmp_path, layout="current")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    subprocess.run(["git", "-C", str(workspace), "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-q",
                    "--allow-empty", "-m", "not a dream"], check=True)
    if target.startswith("the sha"):
        target = subprocess.run(["git", "-C", str(workspace), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    proc = daemon_process(workspace, extra_config='\n[llm]\nmodel = "none"')
    proc.start()
    answer = proc.ctl("restore", target)
    assert answer.returncode != 0
    expected = "is not a dream: commit" if len(target) == 40 else f"no run or dream commit named {target!r}"
    assert expected in answer.stderr
    assert "queued" not in answer.stdout
    assert [run for run in proc.ctl_json("runs", "--all")["runs"] if run["kind"] == "restore"] == []
    assert proc.stop() == 0
