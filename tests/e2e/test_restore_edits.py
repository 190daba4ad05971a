"""A restore of a dream while the agent writes the same memory file: the agent's edit is kept."""

from __future__ import annotations

import pytest

from tests.e2e.llmdaemon import llm_daemon, push_tea_to_coffee_dream
from tests.support.fakellm import FakeLLM


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def ended(daemon, run_id: str) -> dict:
    return daemon.wait_for(lambda: (lambda run: run if run["state"] not in ("queued", "started") else None)(
        daemon.ctl_json("run", run_id)["run"]), timeout=60)


def test_an_edit_the_agent_writes_while_a_restore_merges_is_kept(tmp_path, fake, daemon_process):
    daemon = llm_daemon(tmp_path, fake, daemon_process)
    workspace, release = daemon.workspace, tmp_path / "release"
    (workspace / "memory" / "history.jsonl").write_text(
        '{"cursor": 1, "timestamp": "2026-11-20 10:00", "content": "- The user now drinks coffee."}\n')
    daemon.env["NANOBOTD_FAULTS"] = f"restore.merged=hold:{release}"
    daemon.start()
    daemon.wait_reconciled()
    push_tea_to_coffee_dream(fake)
    dream = ended(daemon, daemon.ctl_json("dream")["run_id"])
    assert dream["state"] == "finished", dream
    user = workspace / "USER.md"
    assert "Likes coffee" in user.read_text()
    restore = daemon.ctl_json("restore", dream["run_id"], "--no-wait")["run_id"]
    daemon.wait_for(lambda: "fault point restore.merged: holding" in daemon.log(), timeout=60)
    user.write_text(user.read_text().replace("# User\n", "# User\n\n## Work\n- Works nights at the observatory.\n"))
    release.touch()
    run = ended(daemon, restore)
    text = user.read_text()
    assert run["state"] == "finished", run
    assert "Works nights at the observatory" in text and "Likes tea" in text and "Likes coffee" not in text, text
