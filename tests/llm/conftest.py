"""Fixtures of the LLM tests: the fake server, recorded backoff, and clients sharing one worker process."""

from __future__ import annotations

import asyncio

import pytest

from nanobotd.config.schema import LLMSettings
from nanobotd.llm.client import LLMClient
from nanobotd.llm.process import LLMWorker
from tests.llm.calls import API_KEY
from tests.support.fakellm import FakeLLM


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
    """One worker process for the package's clients: litellm is imported once, not once per test, and
    before the first test, so no test's timing includes it."""
    shared = LLMWorker()
    asyncio.run(shared.start())
    yield shared
    shared.close(wait=5)


@pytest.fixture
def make_client(worker):
    """Build a client on the shared worker; backoff delays land in *sleeps* instead of being waited."""

    def build(fake: FakeLLM, sleeps: list, api_key: str | None = API_KEY, **overrides) -> LLMClient:
        async def record_sleep(seconds: float) -> None:
            sleeps.append(seconds)

        settings = LLMSettings(model=fake.model, api_base=fake.base_url, **overrides)
        return LLMClient(settings, api_key=api_key, sleep=record_sleep, worker=worker)

    return build
