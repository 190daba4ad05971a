"""Commands that start runs, through a real daemon and the real console script: waiting by default with a
summary, --no-wait, --dry-run, the progress line on a terminal only, Ctrl-C, a joined consolidation, reindex."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import pytest

from tests.e2e.cli import nanobotctl, nanobotctl_json, on_a_terminal
from tests.support.daemonproc import shared_daemon
from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import conversation, make_workspace, write_session

RUN_ID = re.compile(r"r-\d{8}-\d{6}-\w+-[0-9a-f]{6}")


@contextmanager
def module_daemon(tmp_path, extra_config: str = ""):
    """A started daemon the file's tests share, each archiving a session of its own; killed at the end."""
    workspace, sessions = make_workspace(tmp_path, layout="current")
    proc = shared_daemon(tmp_path, workspace, extra_config=extra_config)
    proc.workspace, proc.sessions = workspace, sessions
    try:
        yield proc.start()
    finally:
        proc.kill()


def with_own_session(daemon, request):
    """*daemon*, tracking this test's own session of six messages (`daemon.key`)."""
    daemon.key = f"cli:{request.node.name[5:25]}"
    write_session(daemon.sessions, daemon.key, conversation(6))
    daemon.wait_for(lambda: daemon.session(daemon.key))
    return daemon


@pytest.fixture(scope="module")
def offline_daemon(tmp_path_factory):
    """One offline daemon (owner mode) for the file's offline tests."""
    with module_daemon(tmp_path_factory.mktemp("offline")) as proc:
        yield proc


@pytest.fixture
def offline(offline_daemon, request):
    return with_own_session(offline_daemon, request)


@pytest.fixture(scope="module")
def slow_llm_daemon(tmp_path_factory):
    """One daemon whose LLM takes 1.5 s per answer, so a run is seen while it runs (its LLM worker started once)."""
    with FakeLLM(latency=1.5, default=Text("- [durable] the user likes tea")) as fake, \
            module_daemon(tmp_path_factory.mktemp("slow_llm"), extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0

[consolidation]
flush = false
""") as proc:
        yield proc


@pytest.fixture
def slow_llm(slow_llm_daemon, request):
    return with_own_session(slow_llm_daemon, request)


def history_lines(daemon) -> list[str]:
    """The history lines of the test's own session."""
    path = daemon.workspace / "memory" / "history.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if json.loads(line).get("session_key") == daemon.key]


def test_restore_waits_and_sums_up_no_wait_queues_and_dry_run_changes_nothing(offline):
    consolidated = nanobotctl(offline, "consolidate", offline.key)
    assert consolidated.returncode == 0, consolidated.stderr
    run_id = RUN_ID.search(consolidated.stdout).group(0)
    assert len(history_lines(offline)) == 1

    plan = nanobotctl(offline, "restore", run_id, "--dry-run")
    assert (plan.returncode, plan.stderr) == (0, "")
    assert plan.stdout.splitlines()[0] == f"Dry run: restoring {run_id} would"
    assert plan.stdout.splitlines()[-1] == f"Nothing was changed. To do it: nanobotctl restore {run_id}"
    assert len(history_lines(offline)) == 1

    restored = nanobotctl(offline, "restore", run_id)
    assert (restored.returncode, restored.stderr) == (0, "")
    lines = restored.stdout.splitlines()
    assert re.fullmatch(rf"restore {RUN_ID.pattern}: restored in \d+\.\d\ds", lines[0])
    assert f"  undid:                   consolidate run {run_id}" in lines
    assert "  history entries removed: 1" in lines and "  messages unarchived:     6" in lines
    assert lines[-1].startswith("Details: nanobotctl run r-")
    assert history_lines(offline) == []

    again = nanobotctl(offline, "restore", run_id)
    assert again.returncode == 1 and "already restored" in again.stderr

    second = nanobotctl_json(offline, "consolidate", offline.key)
    queued = nanobotctl(offline, "restore", second["run_id"], "--no-wait")
    assert queued.returncode == 0
    restore_id = RUN_ID.search(queued.stdout).group(0)
    assert queued.stdout == f"queued run {restore_id}\nFollow it with: nanobotctl run {restore_id}\n"
    offline.wait_for(lambda: nanobotctl_json(offline, "run", restore_id)["run"]["state"] == "finished")


def test_waiting_with_json_gives_the_run_id_and_the_whole_run(offline):
    data = nanobotctl_json(offline, "consolidate", offline.key)
    assert data["run_id"] == data["run"]["run_id"] and data["run"]["state"] == "finished"
    assert data["run"]["changes"] == {"entries_added": 1, "messages_archived": 6,
                                      "files": ["memory/history.jsonl"], "commits": []}
    assert data["left_unarchived"] == {"messages": 0, "tokens": 0}
    restored = nanobotctl_json(offline, "restore", data["run_id"])
    assert restored["run"]["outcome"] == "restored"
    assert restored["run"]["manifest"]["removed_entries"][0]["content"].startswith("[RAW]")
    refused = nanobotctl(offline, "--json", "restore", data["run_id"], "--dry-run")
    assert refused.returncode == 1 and "already restored" in refused.stderr


def test_run_is_a_readable_summary_and_json_keeps_the_removed_transcript(offline):
    run_id = nanobotctl_json(offline, "consolidate", offline.key)["run_id"]
    restore_id = nanobotctl_json(offline, "restore", run_id)["run_id"]
    shown = nanobotctl(offline, "run", restore_id)
    assert shown.returncode == 0
    assert shown.stdout.splitlines()[0] == f"run {restore_id}"
    assert "M-0 user says" not in shown.stdout and "{" not in shown.stdout
    assert "  steps:" in shown.stdout and shown.stdout.rstrip().endswith("(--json shows the whole manifest)")
    full = nanobotctl_json(offline, "run", restore_id)["run"]["manifest"]["removed_entries"]
    assert "M-0 user says" in full[0]["content"]
    assert nanobotctl(offline, "run", "r-nope").returncode == 1


def test_reindex_is_a_run_with_a_summary(offline):
    done = nanobotctl(offline, "reindex")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"reindex {RUN_ID.pattern}: reindexed in \d+\.\d\ds", done.stdout.splitlines()[0])
    assert any(line.startswith("  search units indexed:") for line in done.stdout.splitlines())
    data = nanobotctl_json(offline, "reindex")
    assert data["run"]["kind"] == "reindex" and data["run"]["changes"]["units_indexed"] > 0
    assert nanobotctl(offline, "reindex", "--no-wait").stdout.startswith("queued run r-")


def test_the_progress_line_shows_on_a_terminal_and_never_in_a_pipe(slow_llm):
    code, shown = on_a_terminal(slow_llm, "consolidate", slow_llm.key)
    assert code == 0, shown
    progress = [part for part in shown.split("\r") if part.startswith("consolidate r-")]
    assert any("running" in part and re.search(r"\d+\.\d\ds", part) for part in progress), shown
    assert any("archiving 1/1" in part for part in progress), shown
    assert "\x1b[K" in shown and "consolidate r-" in shown.split("\r\x1b[K")[-1]
    write_session(slow_llm.sessions, slow_llm.key, conversation(10))
    slow_llm.wait_for(lambda: slow_llm.session(slow_llm.key)["unarchived_messages"] == 4)
    piped = nanobotctl(slow_llm, "consolidate", slow_llm.key)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "" and "\r" not in piped.stdout and "\x1b" not in piped.stdout
    assert re.fullmatch(rf"consolidate {RUN_ID.pattern}: summarized in \d+\.\d\ds", piped.stdout.splitlines()[0])


def test_ctrl_c_while_waiting_stops_the_waiting_and_not_the_run(slow_llm):
    code, shown = on_a_terminal(slow_llm, "consolidate", slow_llm.key, interrupt_after=0.8)
    assert code == 130, shown
    assert "stopped waiting; the run goes on in the daemon (Ctrl-C does not cancel it)" in shown
    run_id = RUN_ID.search(shown.split("Follow it with:")[1]).group(0)
    finished = slow_llm.wait_for(lambda: (lambda run: run if run["state"] == "finished" else None)(
        nanobotctl_json(slow_llm, "run", run_id)["run"]), timeout=60)
    assert finished["outcome"] == "summarized" and finished["changes"]["messages_archived"] == 6


def test_a_manual_consolidate_archives_everything_even_behind_a_budget_run(tmp_path, daemon_process):
    with FakeLLM(latency=1.0, default=Text("- [durable] summary")) as fake:
        workspace, sessions = make_workspace(tmp_path, layout="current")
        proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
context_window = 5000
max_tokens = 1000

[consolidation]
flush = false
idle_minutes = 600
""")
        proc.start()
        write_session(sessions, "cli:big", conversation(120, words=12))
        proc.wait_for(lambda: [run for run in proc.ctl_json("runs", "--all")["runs"] if run["state"] == "started"])
        write_session(sessions, "cli:big", conversation(140, words=12))  # a second budget trigger queues
        done = nanobotctl(proc, "consolidate", "cli:big", timeout=120)
        assert done.returncode == 0, done.stderr
        assert "  left unarchived:       0 messages, 0 tokens" in done.stdout.splitlines()
        assert proc.session("cli:big")["unarchived_messages"] == 0
        data = json.loads(nanobotctl(proc, "--json", "run", RUN_ID.search(done.stdout).group(0)).stdout)
        assert data["run"]["trigger"] == "manual"
