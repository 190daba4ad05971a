"""Fixtures of the dream tests: a tmp workspace, a real state store, a real git store, the fake LLM server."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.gitstore.store import GitStore
from nanobotd.state.store import StateStore
from tests.jobs.dream.scenario import MEMORY, SOUL, USER, write_history


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "memory").mkdir(parents=True)
    for path, text in zip(MEMORY_FILES, (SOUL, USER, MEMORY), strict=True):
        (root / path).write_text(text)
    (root / "memory" / ".dream_cursor").write_text("0")
    write_history(root, 5)
    return root


@pytest.fixture
def store(tmp_path: Path):
    state = StateStore(tmp_path / "state").open()
    yield state
    state.close()


@pytest.fixture
def git(workspace: Path):
    git_store = GitStore(workspace)
    git_store.open()
    yield git_store
    git_store.close()
