"""The upkeep endpoints through a real daemon: dream, restore, dream-log, search, lifecycle, audit, observe."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta

import pytest

from tests.e2e.llmdaemon import llm_daemon
from tests.support.fakellm import FakeLLM, Text, ToolCalls
from tests.support.workspace import conversation, write_session


def git(workspace, *args) -> str:
    return subprocess.run(["git", "-C", str(workspace), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def daemon(tmp_path, fake, daemon_process):
    proc = llm_daemon(tmp_path, fake, daemon_process)
    yield proc
    proc.kill()


def wait_run(daemon, run_id: str) -> dict:
    return daemon.wait_for(lambda: (lambda run: run if run["state"] not in ("queued", "started") else None)(
        daemon.ctl_json("run", run_id)["run"]), timeout=60)


def test_consolidate_then_dream_then_restore_through_the_cli(daemon, fake):
    write_session(daemon.sessions, "cli:a", conversation(6))
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:a"))
    fake.push(Text("- [correction] The user prefers coffee, not tea"))
    consolidated = daemon.ctl("consolidate", "cli:a", "--wait")
    assert consolidated.returncode == 0, consolidated.stderr
    before = (daemon.workspace / "USER.md").read_bytes()
    fake.push(Text("[USER] correction: prefers coffee, not tea"),
              ToolCalls([("edit_file", {"path": "USER.md",
                                        "edits": [{"old_text": "- Likes tea.", "new_text": "- Likes coffee."}]})]),
              Text("done"))
    queued = daemon.ctl_json("dream")
    dream_run = wait_run(daemon, queued["run_id"])
    assert dream_run["state"] == "finished", dream_run
    assert "Likes coffee" in (daemon.workspace / "USER.md").read_text()
    log = git(daemon.workspace, "log", "--format=%s%n%b")
    assert "dream:" in log and f"Nanobot-Run: {queued['run_id']}" in log
    shown = daemon.ctl("dream-log", queued["run_id"])
    assert shown.returncode == 0 and "Likes coffee" in shown.stdout
    plan = daemon.ctl("restore", queued["run_id"], "--dry-run")
    assert plan.returncode == 0 and plan.stdout.strip()
    restored = daemon.ctl_json("restore", queued["run_id"])
    assert wait_run(daemon, restored["run_id"])["state"] == "finished"
    assert (daemon.workspace / "USER.md").read_bytes() == before
    assert len(git(daemon.workspace, "log", "--format=%s").splitlines()) >= 3
    unknown = daemon.ctl("restore", "r-nope")
    assert unknown.returncode == 1 and "no run" in unknown.stderr
    metrics = daemon.ctl_json("observe", "--since", "1d")
    kinds = {row["kind"] for row in metrics["rows"]}
    assert {"consolidate", "dream"} <= kinds


def test_search_finds_a_fact_written_to_memory_within_seconds_and_forgets_deleted_sections(daemon):
    daemon.start()
    memory = daemon.workspace / "memory" / "MEMORY.md"
    memory.write_text(memory.read_text() + "\n## Infrastructure\n- The backup host is called osprey.\n")
    subprocess.run(daemon_ctl_reindex(daemon), capture_output=True)
    hits = daemon.wait_for(lambda: daemon.ctl_json("search", "osprey backup host")["hits"], timeout=10)
    assert hits[0]["path"].endswith("MEMORY.md") and hits[0]["line_start"]

    def refreshed() -> dict | None:
        search = daemon.ctl_json("status")["workspaces"][0]["search"]
        return search if search["refreshes"] >= 1 else None

    # the write's own refresh comes after its debounce; the reindex (a run, not a refresh) may find it first
    search = daemon.wait_for(refreshed, timeout=10)
    # its seconds are shown to the millisecond: a refresh with nothing left to do (the reindex did it) shows 0.0
    assert isinstance(search["refresh_seconds"], float) and search["refresh_seconds"] >= 0
    assert search["refreshing"] in (True, False)
    memory.write_text("# Memory\n")
    daemon.ctl("reindex")
    daemon.wait_for(lambda: not [hit for hit in daemon.ctl_json("search", "osprey")["hits"]
                                 if hit["path"].endswith("MEMORY.md")], timeout=10)
    skill = daemon.workspace / "skills" / "memory-search" / "SKILL.md"
    assert "nanobotctl search" in skill.read_text()


def daemon_ctl_reindex(daemon):
    import sys

    from tests.support.daemonproc import CTL

    return [sys.executable, "-c", CTL, "--socket", str(daemon.socket), "reindex"]


def test_lifecycle_dry_run_and_audit_report_through_the_cli(daemon):
    old = (datetime.now() - timedelta(days=12)).strftime("%Y-%m-%d")
    (daemon.workspace / "memory" / f"{old}.md").write_text(f"# {old}\n\n## Topics\n- old topic\n")
    daemon.start()
    plan = daemon.ctl_json("lifecycle", "--dry-run")["plan"]
    assert any(old in line for line in plan)
    assert (daemon.workspace / "memory" / f"{old}.md").exists()
    audit = daemon.ctl_json("audit")["workspaces"][0]
    assert "plan" in audit and "problems" in audit
    ran = daemon.ctl_json("lifecycle")
    assert wait_run(daemon, ran["run_id"])["state"] == "finished"
    assert (daemon.workspace / "memory" / "archive" / f"{old}.md").exists()
    restored = daemon.ctl_json("restore", ran["run_id"])
    assert wait_run(daemon, restored["run_id"])["state"] == "finished"
    assert (daemon.workspace / "memory" / f"{old}.md").exists()
    status = daemon.wait_for(lambda: (lambda ws: ws if ws["git"]["available"] else None)(
        daemon.ctl_json("status")["workspaces"][0]))  # git opens after the start-up reconcile
    assert status["jobs"]["dream"]["next_run"] and status["git"]["available"] is True
    assert json.dumps(status)


def test_a_dream_is_restored_from_its_backups_after_the_workspaces_git_folder_was_deleted(daemon, fake):
    """The user removed `<workspace>/.git` (or copied the workspace without its dot folders): the dream's commit is
    gone, its backups are not. The restore puts them back, and the repository is made again as nanobot makes it."""
    import shutil

    write_session(daemon.sessions, "cli:a", conversation(6))
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:a"))
    fake.push(Text("- [correction] The user prefers coffee, not tea"))
    assert daemon.ctl("consolidate", "cli:a").returncode == 0
    before = (daemon.workspace / "USER.md").read_bytes()
    fake.push(Text("[USER] correction: prefers coffee, not tea"),
              ToolCalls([("edit_file", {"path": "USER.md",
                                        "edits": [{"old_text": "- Likes tea.", "new_text": "- Likes coffee."}]})]),
              Text("done"))
    dream_run = wait_run(daemon, daemon.ctl_json("dream")["run_id"])
    assert dream_run["state"] == "finished" and b"Likes coffee" in (daemon.workspace / "USER.md").read_bytes()
    shutil.rmtree(daemon.workspace / ".git")
    plan = daemon.ctl("restore", dream_run["run_id"], "--dry-run")
    assert plan.returncode == 0 and "from the run's backups" in plan.stdout, plan.stderr
    restored = daemon.ctl("restore", dream_run["run_id"])
    assert restored.returncode == 0, restored.stderr
    assert (daemon.workspace / "USER.md").read_bytes() == before
    assert daemon.ctl_json("status")["workspaces"][0]["git"]["available"]
    assert "USER.md" in git(daemon.workspace, "ls-files")
