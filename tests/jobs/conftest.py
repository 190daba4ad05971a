"""Fixtures the job tests share: a real state store, a real OpenAI-compatible server, a workspace."""

from __future__ import annotations

import pytest

from nanobotd.config.schema import WorkspaceSettings
from nanobotd.state.store import StateStore
from tests.support.fakellm import FakeLLM


@pytest.fixture
def store(tmp_path):
    opened = StateStore(tmp_path / "state").open()
    yield opened
    opened.close()


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    return WorkspaceSettings(path=tmp_path / "ws", name="main")
