"""Fixtures of the lifecycle tests: a settable clock and a real state store that reads it."""

from __future__ import annotations

import pytest

from nanobotd.state.store import StateStore
from tests.jobs.lifecycle.scenario import NOW, Clock


@pytest.fixture
def clock():
    return Clock(NOW)


@pytest.fixture
def store(tmp_path, clock):
    opened = StateStore(tmp_path / "state", clock=clock).open()
    yield opened
    opened.close()
