"""The job registry: every kind answers the Job interface alike, and restore reaches kinds only through it."""

from __future__ import annotations

import asyncio
import inspect
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanobotd.config.schema import LLMSettings, WorkspaceSettings
from nanobotd.jobs import restore
from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.errors import RestoreError
from nanobotd.jobs.flush import flush_session
from nanobotd.jobs.job import QueuePolicy
from nanobotd.jobs.registry import JOB_KINDS, SCHEDULED_KINDS, job_kind
from nanobotd.llm.client import LLMClient
from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from tests.support.fakellm import Text
from tests.support.llmworker import llm_client

NOW = datetime(2026, 3, 5, 21, 30)
FLUSH_REPLY = "## Topics\n- Backups of the photo library\n\n## Decisions\n- Use restic for backups.\n"
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def job_env(tmp_path: Path, store: StateStore, llm: LLMClient, kinds) -> JobEnv:
    (tmp_path / "ws" / "memory").mkdir(parents=True, exist_ok=True)
    settings = WorkspaceSettings(path=tmp_path / "ws", name="main")
    return JobEnv(settings, store, SessionTracker("main", store), llm, lambda: NOW, kinds=kinds)


def flush_run(env: JobEnv) -> str:
    """A real flush run that created today's note from a four-message conversation."""
    messages = [PendingMessage(f"d{index}", role, "2026-03-05T10:00:00", f"message {index} about backups", 8,
                               {"role": role, "content": f"message {index} about backups"})
                for index, role in enumerate(("user", "assistant", "user", "assistant"))]
    run_id = env.store.create_run("flush", "main", session_key="telegram:1")
    asyncio.run(flush_session(env.settings, messages, session_key="telegram:1", llm=env.llm, store=env.store,
                              run_id=run_id, now=NOW))
    return run_id


def positional_names(function) -> list[str]:
    return [parameter.name for parameter in inspect.signature(function).parameters.values()
            if parameter.kind in POSITIONAL]


def keyword_only_names(function) -> set[str]:
    return {parameter.name for parameter in inspect.signature(function).parameters.values()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize("kind", sorted(JOB_KINDS))
def test_every_registered_kind_answers_the_job_interface_with_the_same_arguments(kind, tmp_path, store):
    job = job_kind(kind)
    assert job.kind == kind
    assert inspect.iscoroutinefunction(job.run) and positional_names(job.run) == ["env", "run_id", "params"]
    assert not inspect.iscoroutinefunction(job.recover) and positional_names(job.recover) == ["env", "run"]
    assert inspect.iscoroutinefunction(job.restore) and len(positional_names(job.restore)) == 2
    assert positional_names(job.restore)[0] == "env"
    assert keyword_only_names(job.restore) == {"restore_run_id", "force", "dry_run"}
    assert keyword_only_names(job.reapply) == {"restore_run_id", "force", "dry_run"}
    env = job_env(tmp_path, store, LLMClient(LLMSettings(model="none")), JOB_KINDS)
    params = {"session_key": "cli:a", "reason": "manual", "target": "r-1", "force": False}
    assert isinstance(job.queue_policy(env, params), QueuePolicy)
    assert isinstance(job.changes({}), dict)


def test_scheduled_kinds_are_registered_and_an_unknown_kind_names_the_known_ones():
    assert set(SCHEDULED_KINDS) == {"dream", "lifecycle"}
    with pytest.raises(KeyError, match="known: consolidate, flush, dream, lifecycle, restore, reindex"):
        job_kind("defragment")


def test_restoring_a_flush_run_goes_through_the_registry_in_the_job_env(tmp_path, store, fake):
    fake.push(Text(FLUSH_REPLY))
    llm = llm_client(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
    env = job_env(tmp_path, store, llm, JOB_KINDS)
    target = flush_run(env)
    note = env.memory_dir / "2026-03-05.md"
    assert "- Use restic for backups." in note.read_text()
    restore_id = store.create_run("restore", "main")
    manifest = asyncio.run(JOB_KINDS["restore"].run(env, restore_id, {"target": target, "force": False}))
    assert manifest["target_kind"] == "flush" and manifest["action"] == "delete"
    assert not note.exists()
    assert store.get_run(restore_id).outcome == "restored"
    assert store.get_run(target).manifest["restored_by"] == restore_id


def test_a_run_whose_backups_were_pruned_is_refused_before_its_job_is_asked(tmp_path, store, fake):
    fake.push(Text(FLUSH_REPLY))
    llm = llm_client(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
    env = job_env(tmp_path, store, llm, JOB_KINDS)
    target = flush_run(env)
    store.journal(target, {**store.get_run(target).manifest, "expired": True, "expired_by": "r-lifecycle"})
    with pytest.raises(RestoreError, match="older than the restore window"):
        asyncio.run(restore.plan(env, target, force=False))
    assert (env.memory_dir / "2026-03-05.md").exists()


def test_restore_reaches_a_job_only_through_env_kinds(tmp_path, store, fake):
    fake.push(Text(FLUSH_REPLY))
    llm = llm_client(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
    target = flush_run(job_env(tmp_path, store, llm, JOB_KINDS))
    calls = []

    async def stand_in_restore(env, run, *, restore_run_id, force, dry_run):
        calls.append((run.run_id, restore_run_id, force, dry_run))
        return {"plan": ["undo by the stand-in"]}

    env = job_env(tmp_path, store, llm, {"flush": SimpleNamespace(restore=stand_in_restore, restorable=True)})
    plan = asyncio.run(restore.plan(env, target, force=False))
    assert plan == {"plan": ["undo by the stand-in"], "kind": "flush"}
    assert calls == [(target, None, False, True)]
    assert (env.memory_dir / "2026-03-05.md").exists()
