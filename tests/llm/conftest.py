"""Fixtures of the LLM tests: the fake server, recorded backoff, and clients sharing one worker process."""

from __future__ import annotations

import asyncio

import pytest

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import LLMClient
from tests.llm.calls import API_KEY
from tests.support.fakellm import FakeLLM
from tests.support.llmworker import shared_worker


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def sleeps():
    """Backoff delays the client asked for; the waiting itself is skipped."""
    return []


@pytest.fixture(scope="package")
def worker():
    """The test process's one worker (tests/support/llmworker.py), shared with the clients of the other packages:
    litellm is imported once per process, not once per test nor once more for this package, and before the
    package's first test, so no test's timing includes it (a test that killed its child leaves the next call a new
    one)."""
    shared = shared_worker()
    asyncio.run(shared.start())
    return shared


@pytest.fixture
def make_client(worker):
    """Build a client on the shared worker; backoff delays land in *sleeps* instead of being waited."""

    def build(fake: FakeLLM, sleeps: list, api_key: str | None = API_KEY, **overrides) -> LLMClient:
        async def record_sleep(seconds: float) -> None:
            sleeps.append(seconds)

        settings = LLMSettings(model=fake.model, api_base=fake.base_url, **overrides)
        return LLMClient(settings, api_key=api_key, sleep=record_sleep, worker=worker)

    return build
