"""SIGKILL in the middle of a dream's apply step and of a lifecycle run: the next start finishes or rolls back
the run, and no memory file, note, history entry or cursor is lost or left half-changed."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta

import pytest

from tests.e2e.llmdaemon import llm_daemon, push_tea_to_coffee_dream
from tests.support.daemonproc import FIRST_LLM_CALL_SECONDS
from tests.support.fakellm import FakeLLM, Text
from tests.support.workspace import conversation, make_workspace, write_session

AGENT_ENTRY = {"cursor": 1, "timestamp": "2026-11-20 10:00", "content": "- [durable] The user now drinks coffee.",
               "session_key": "cli:a"}


def git(workspace, *args) -> str:
    return subprocess.run(["git", "-C", str(workspace), *args], capture_output=True, text=True, check=True).stdout


def killed(daemon) -> None:
    daemon.wait_for(lambda: daemon.proc.poll() is not None, timeout=60)
    assert daemon.proc.returncode == -9, daemon.log()[-3000:]


def run_of(daemon, run_id: str) -> dict:
    return daemon.ctl_json("run", run_id)["run"]


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.mark.parametrize("stage", ["applying", "files_written", "cursor_written", "committed"])
def test_sigkill_in_a_dreams_apply_step_is_rolled_back_or_finished_at_the_next_start(tmp_path, fake, daemon_process,
                                                                                      stage):
    daemon = llm_daemon(tmp_path, fake, daemon_process)
    workspace = daemon.workspace
    memory = workspace / "memory"
    (memory / "history.jsonl").write_text(json.dumps(AGENT_ENTRY) + "\n")
    daemon.env["NANOBOTD_FAULTS"] = f"dream.{stage}=kill"
    daemon.start()
    daemon.wait_reconciled()
    user_before = (workspace / "USER.md").read_bytes()
    push_tea_to_coffee_dream(fake)
    run_id = daemon.ctl_json("dream", "--no-wait")["run_id"]
    killed(daemon)
    daemon.env.pop("NANOBOTD_FAULTS")
    daemon.start()
    daemon.wait_reconciled(starts=2)
    run = daemon.wait_for(lambda: (lambda r: r if r["state"] not in ("queued", "started") else None)(
        run_of(daemon, run_id)))
    user_after = (workspace / "USER.md").read_bytes()
    cursor = (memory / ".dream_cursor").read_text() if (memory / ".dream_cursor").exists() else "0"
    if stage == "committed":
        assert run["state"] == "finished", run
        assert b"Likes coffee" in user_after and cursor == "1"
        assert f"Nanobot-Run: {run_id}" in git(workspace, "log", "--format=%B")
    else:
        assert run["state"] == "rolled_back", run
        assert user_after == user_before and cursor == "0"
    assert not [path.name for path in (*workspace.iterdir(), *memory.iterdir()) if path.name.endswith(".undo.tmp")]
    assert git(workspace, "status", "--porcelain", "--", "USER.md", "SOUL.md", "memory/MEMORY.md") == ""
    assert json.loads((memory / "history.jsonl").read_text()) == AGENT_ENTRY


def write_note(memory, day: datetime, text: str):
    path = memory / f"{day:%Y-%m-%d}.md"
    path.write_text(f"# {day:%Y-%m-%d}\n\n## Decisions\n- {text}\n")
    return path


@pytest.mark.parametrize("action", ["move", "summarise", "delete"])
def test_sigkill_between_lifecycle_steps_puts_every_note_and_entry_back_at_the_next_start(tmp_path, daemon_process,
                                                                                          action):
    workspace, _ = make_workspace(tmp_path)
    memory = workspace / "memory"
    today = datetime.now()
    recent = write_note(memory, today - timedelta(days=10), "Recent decision on osprey.")
    expired = write_note(memory, today - timedelta(days=120), "Old decision on kestrel.")
    notes_before = {path: path.read_bytes() for path in (recent, expired)}
    (memory / "history.jsonl").write_text(json.dumps(AGENT_ENTRY) + "\n")
    daemon = daemon_process(workspace, env={"NANOBOTD_FAULTS": f"lifecycle.{action}=kill"}).start()
    daemon.wait_reconciled()
    queued = daemon.ctl_json("lifecycle", "--no-wait")
    killed(daemon)
    daemon.env.pop("NANOBOTD_FAULTS")
    daemon.start()
    daemon.wait_reconciled(starts=2)
    run = run_of(daemon, queued["run_id"])
    assert run["state"] == "rolled_back", run
    assert {path: path.read_bytes() for path in notes_before if path.exists()} == notes_before
    assert not list((memory / "archive").glob("*.md")) if (memory / "archive").exists() else True
    assert [json.loads(line) for line in (memory / "history.jsonl").read_text().splitlines()] == [AGENT_ENTRY]


def test_an_edit_the_agent_writes_while_the_dream_applies_its_own_is_kept(tmp_path, fake, daemon_process):
    daemon = llm_daemon(tmp_path, fake, daemon_process)
    workspace, release = daemon.workspace, tmp_path / "release"
    (workspace / "memory" / "history.jsonl").write_text(json.dumps(AGENT_ENTRY) + "\n")
    daemon.env["NANOBOTD_FAULTS"] = f"dream.applying=hold:{release}"
    daemon.start()
    daemon.wait_reconciled()
    push_tea_to_coffee_dream(fake)
    run_id = daemon.ctl_json("dream", "--no-wait")["run_id"]
    daemon.wait_for(lambda: "fault point dream.applying: holding" in daemon.log(), timeout=60)
    user = workspace / "USER.md"
    user.write_text(user.read_text() + "\n## Work\n- Works nights at the observatory.\n")  # the agent's own edit
    release.touch()
    run = daemon.wait_for(lambda: (lambda r: r if r["state"] not in ("queued", "started") else None)(
        run_of(daemon, run_id)))
    text = user.read_text()
    assert "Works nights at the observatory" in text, (run, text)
    if run["state"] == "finished":
        assert "Likes coffee" in text


def test_a_bullet_the_agent_writes_to_todays_note_while_a_flush_merges_is_kept(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    release = tmp_path / "release"
    with FakeLLM(default=Text("## Decisions\n- Backups go to the cold bucket.\n")) as fake:
        daemon = daemon_process(workspace, env={"NANOBOTD_FAULTS": f"flush.journalled=hold:{release}"},
                                extra_config=f'[llm]\nmodel = "{fake.model}"\napi_base = "{fake.base_url}"\n'
                                             'max_retries = 0\n')
        write_session(sessions, "cli:a", conversation(6))
        daemon.start()
        daemon.wait_for(lambda: daemon.session("cli:a"))
        run_id = daemon.ctl_json("flush", "cli:a", "--no-wait")["run_id"]
        daemon.wait_for(lambda: "fault point flush.journalled: holding" in daemon.log(), timeout=FIRST_LLM_CALL_SECONDS)
        note = workspace / "memory" / (datetime.now().strftime("%Y-%m-%d") + ".md")
        text = note.read_text() if note.exists() else "## Decisions\n"
        note.write_text(text.replace("## Decisions\n", "## Decisions\n- The agent wrote this itself.\n"))
        release.touch()
        run = daemon.wait_for(lambda: (lambda r: r if r["state"] not in ("queued", "started") else None)(
            run_of(daemon, run_id)))
    text = note.read_text()
    assert "The agent wrote this itself" in text, (run, text)
    assert run["outcome"] == "written" and "cold bucket" in text, (run, text)


def test_sigkill_after_a_lifecycles_history_compaction_puts_the_entries_back_at_the_next_start(tmp_path,
                                                                                               daemon_process):
    workspace, _ = make_workspace(tmp_path)
    memory = workspace / "memory"
    entries = [dict(AGENT_ENTRY, cursor=cursor, content=f"- [durable] fact {cursor}") for cursor in range(1, 7)]
    (memory / "history.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    (memory / ".dream_cursor").write_text("6")
    daemon = daemon_process(workspace, env={"NANOBOTD_FAULTS": "lifecycle.compact_history=kill"},
                            extra_config="[lifecycle]\nmax_history_entries = 2\n").start()
    daemon.wait_reconciled()
    queued = daemon.ctl_json("lifecycle", "--no-wait")
    killed(daemon)
    assert len((memory / "history.jsonl").read_text().splitlines()) == 2
    daemon.env.pop("NANOBOTD_FAULTS")
    daemon.start()
    daemon.wait_reconciled(starts=2)
    assert run_of(daemon, queued["run_id"])["state"] == "rolled_back"
    assert [json.loads(line) for line in (memory / "history.jsonl").read_text().splitlines()] == entries
