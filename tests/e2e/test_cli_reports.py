"""Commands that report, through a real daemon and the real console script: workspace by name or path,
option checks, observe, search and context that say what happened, status, hidden no-op runs, the log."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.e2e.cli import nanobotctl, nanobotctl_json
from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import conversation, make_workspace, write_session


@pytest.fixture
def offline(tmp_path, daemon_process):
    """An offline daemon archiving (owner mode) three sessions."""
    workspace, sessions = make_workspace(tmp_path, layout="current")
    for key in ("cli:a", "cli:b", "cli:c"):
        write_session(sessions, key, conversation(4, tag=key[-1]))
    proc = daemon_process(workspace)
    proc.workspace = workspace
    proc.start()
    proc.wait_for(lambda: len(proc.ctl_json("sessions")["sessions"]) == 3)
    return proc


def test_workspace_by_path_filters_runs_and_sessions_as_its_name_does(offline):
    nanobotctl_json(offline, "consolidate", "cli:a")
    for value in ("ws", str(offline.workspace), str(offline.workspace) + "/"):
        assert len(nanobotctl_json(offline, "--workspace", value, "sessions")["sessions"]) == 3, value
        assert len(nanobotctl_json(offline, "--workspace", value, "runs")["runs"]) == 1, value
    relative = nanobotctl(offline, "--json", "--workspace", "./workspace", "runs", cwd=offline.workspace.parent)
    assert relative.returncode == 0 and len(json.loads(relative.stdout)["runs"]) == 1
    unknown = nanobotctl(offline, "--workspace", "./workspace", "runs")  # from elsewhere: another path
    assert unknown.returncode == 1 and "known: ws" in unknown.stderr


def test_a_bad_limit_is_refused_naming_the_flag_and_its_range(offline):
    refused = nanobotctl(offline, "runs", "--limit", "0")
    assert refused.returncode == 2
    assert "argument --limit: must be a whole number from 1 to 1,000, not '0'" in refused.stderr
    assert "query parameter" not in refused.stderr


def test_observe_counts_three_restores_and_names_the_fallback_reason(offline):
    for key in ("cli:a", "cli:b", "cli:c"):
        run_id = nanobotctl_json(offline, "consolidate", key)["run_id"]
        assert nanobotctl(offline, "restore", run_id).returncode == 0
    data = nanobotctl_json(offline, "observe", "--since", "1h")
    assert data["restores"]["total"] == 3 and data["restores"]["by_kind"] == {"consolidate": 3}
    row = next(row for row in data["rows"] if row["kind"] == "consolidate")
    assert row["restored"] == 3
    assert row["fallback_reasons"] == {"offline mode: no LLM configured": 3}
    shown = nanobotctl(offline, "observe", "--since", "1h").stdout
    assert "restores: 3 (restored 3); undid consolidate 3" in shown
    assert "raw fallback in consolidate/ws: offline mode: no LLM configured (x3)" in shown
    assert "(no reason given)" not in shown


def test_search_context_and_status_say_what_happened(offline):
    vector = nanobotctl(offline, "search", "--mode", "vsearch", "kestrel")
    assert vector.returncode == 0
    assert vector.stdout.splitlines()[0].startswith("note: --mode vsearch needs QMD with vectors")
    assert "vsearch needs QMD" in nanobotctl_json(offline, "search", "--mode", "vsearch", "kestrel")["fallback"]
    assert "fallback" not in nanobotctl_json(offline, "search", "kestrel")

    tiny = nanobotctl(offline, "context", "cli:a", "--query", "says", "--budget", "5")
    assert (tiny.returncode, tiny.stdout) == (0, "")
    assert "the context is empty: a budget of 5 tokens fits none of" in tiny.stderr
    assert "warning" in nanobotctl_json(offline, "context", "cli:a", "--query", "says", "--budget", "5")
    unknown = nanobotctl(offline, "context", "cli:nope")
    assert (unknown.returncode, unknown.stdout) == (1, "")
    assert "no session 'cli:nope'" in unknown.stderr

    status = nanobotctl(offline, "status").stdout.splitlines()
    assert not [line for line in status if re.search(r"\w=\w", line)], status  # no `units=185, ...` run-ons
    assert any(re.fullmatch(r"    index +\d+ units from \d+ files, \d+ KiB, refreshed .+", line) for line in status)
    assert "  dream       off: the dream needs an LLM and this workspace runs offline (llm.model = \"none\")" \
        in status
    assert nanobotctl_json(offline, "status")["workspaces"][0]["jobs"]["dream"]["next_run"] is None


def test_a_consolidation_that_changes_nothing_is_hidden_from_runs_and_counted_by_observe(offline):
    nanobotctl_json(offline, "consolidate", "cli:a")
    again = nanobotctl(offline, "consolidate", "cli:a")
    assert again.returncode == 0 and "  changed:         nothing" in again.stdout.splitlines()
    listed = nanobotctl(offline, "runs")
    assert len(nanobotctl_json(offline, "runs")["runs"]) == 1
    assert "(1 run that changed nothing not shown: --all lists them" in listed.stdout
    assert [run["outcome"] for run in nanobotctl_json(offline, "runs", "--all")["runs"]] == [
        "no_change", "raw_fallback"]
    row = nanobotctl_json(offline, "observe")["rows"][0]
    assert (row["no_change"], row["raw_fallback"]) == (1, 1)


def test_the_log_has_one_line_per_run_and_a_first_start_is_not_a_warning(offline):
    run_id = nanobotctl_json(offline, "consolidate", "cli:b")["run_id"]
    offline.wait_for(lambda: run_id in offline.log())
    line = next(line for line in offline.log().splitlines() if f"run {run_id}" in line)
    assert " INFO " in line
    assert (f"run {run_id} (consolidate, workspace ws session cli:b) finished: raw_fallback in " in line
            and "history entries added: 1, messages archived: 4, files: memory/history.jsonl" in line), line
    assert "state database created at" in offline.log() and "(re)created" not in offline.log()
    assert offline.stop() == 0
    (offline.state_dir / "state.db").unlink()
    offline.start()
    assert "WARNING  nanobotd.daemon.daemon: state database was (re)created" in offline.log()


def test_sigterm_ends_the_process_promptly_once_stopped_even_with_litellm_loaded(tmp_path, daemon_process):
    with FakeLLM(default=Text("- [durable] tea")) as fake:
        workspace, sessions = make_workspace(tmp_path, layout="current")
        write_session(sessions, "cli:a", conversation(4))
        proc = daemon_process(workspace, extra_config=f"""
[llm]
model = "{fake.model}"
api_base = "{fake.base_url}"
max_retries = 0
""")
        proc.start()
        proc.wait_for(lambda: proc.session("cli:a"))
        assert nanobotctl_json(proc, "consolidate", "cli:a")["run"]["outcome"] == "summarized"  # litellm is in
        began = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(timeout=30) == 0
        took = time.monotonic() - began
        assert "stopped" in proc.log()
        # a hang (threads left waiting on litellm's worker, a queue never drained) takes the 30 s above; an exit
        # that only competes for a loaded machine's two cores takes well under this bound
        assert took < 10, f"{took:.2f}s from SIGTERM to exit"
