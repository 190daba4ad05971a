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
    proc.wait_for(lambda: proc.ctl_json("status")["workspaces"][0]["git"]["available"])  # opens after the reconcile
    answer = proc.ctl("restore", target)
    assert answer.returncode != 0
    expected = "is not a dream: commit" if len(target) == 40 else f"no run or dream commit named {target!r}"
    assert expected in answer.stderr
    assert "queued" not in answer.stdout
    assert [run for run in proc.ctl_json("runs", "--all")["runs"] if run["kind"] == "restore"] == []
    assert proc.stop() == 0


def test_a_restored_rescue_is_archived_again_after_the_grace_and_the_summary_says_so(tmp_path, daemon_process):
    """Companion mode: messages that left the session file were rescued; restoring the rescue puts them back
    in the spool, and the daemon archives them again after the grace period, each once."""
    from tests.support.workspace import conversation, history_entries, write_session

    grace = 2.0
    workspace, sessions = make_workspace(tmp_path, layout="current")
    messages = conversation(6, tag="v")
    write_session(sessions, "cli:v", messages)
    proc = daemon_process(workspace, mode="companion", extra_config=f"""
[llm]
model = "none"

[consolidation]
agent_grace_seconds = {grace}
""")
    proc.start()
    proc.wait_for(lambda: (proc.session("cli:v") or {}).get("unarchived_messages") == 6)
    write_session(sessions, "cli:v", [])  # /new cut the file, and no archive entry of the agent came

    def archived_texts() -> str:
        return "\n".join(entry["content"] for entry in history_entries(workspace) if "nanobotd_span" in entry)

    proc.wait_for(lambda: archived_texts(), timeout=grace + 20)
    rescue = proc.ctl_json("runs", "--kind", "consolidate")["runs"][0]["run_id"]
    restored = proc.ctl("restore", rescue)
    assert restored.returncode == 0, restored.stderr
    assert archived_texts() == ""
    assert "nanobotctl consolidate cli:v" in proc.ctl("run", proc.ctl_json("runs", "--kind", "restore")["runs"][0]
                                                       ["run_id"]).stdout
    proc.wait_for(lambda: archived_texts(), timeout=grace + 20)
    text = archived_texts()
    for message in messages:
        assert text.count(message["content"].split(" ")[0] + " ") == 1, message["content"]
    assert proc.ctl_json("status")["workspaces"][0]["archived_twice"] == 0
    assert proc.stop() == 0


def test_restoring_a_run_after_memory_was_deleted_leaves_the_entry_a_later_run_wrote_at_its_cursor(
        tmp_path, daemon_process):
    """memory/ deleted while the daemon runs: history's cursors start again at 1, so a later run's entry takes the
    cursor an older run's entry had. Restoring the older run removed that entry, and the later run's messages,
    marked archived, were in history no more."""
    import shutil

    from tests.support.workspace import conversation, history_entries, write_session

    def counts(tag: str) -> list[int]:
        text = "\n".join(entry["content"] for entry in history_entries(workspace))
        return [text.count(f"{tag.upper()}-{index} ") for index in range(4)]

    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, "cli:a", conversation(4, tag="a"))
    proc = daemon_process(workspace, extra_config='\n[llm]\nmodel = "none"')
    proc.start()
    proc.wait_for(lambda: (proc.session("cli:a") or {}).get("unarchived_messages") == 4)
    older = proc.ctl_json("consolidate", "cli:a")["run_id"]
    shutil.rmtree(workspace / "memory")
    write_session(sessions, "cli:b", conversation(4, tag="b"))
    proc.wait_for(lambda: (proc.session("cli:b") or {}).get("unarchived_messages") == 4)
    proc.ctl_json("consolidate", "cli:b")
    assert [entry["cursor"] for entry in history_entries(workspace)] == [1]  # the cursor the older run's entry had
    dry_run = proc.ctl("restore", older, "--dry-run")
    assert "no history entries to remove" in dry_run.stdout, dry_run.stdout
    restored = proc.ctl("restore", older)
    assert restored.returncode == 0, restored.stderr
    assert counts("b") == [1, 1, 1, 1]
    assert proc.stop() == 0
