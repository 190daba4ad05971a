"""nanobotd/daemon/workspace.py: a scan estimates tokens; a tail near a threshold is counted exactly, once."""

from __future__ import annotations

import asyncio
from datetime import datetime

from nanobotd import tokens
from nanobotd.config.schema import ConsolidationSettings, LLMSettings, WorkspaceSettings
from nanobotd.daemon.workspace import Workspace
from nanobotd.sessions import file as sessionfile
from nanobotd.state.store import StateStore
from tests.support.workspace import conversation, make_workspace, write_session


def _exact(messages: list[dict]) -> int:
    total = 0
    for record in messages:
        _, text, _ = sessionfile.message_fields(record)
        total += tokens.count_tokens(sessionfile.message_text_for_tokens(record, text), tokens.AGENT_ENCODING)
    return total


def test_a_tail_near_a_threshold_is_counted_exactly_and_one_far_from_it_is_only_estimated(tmp_path):
    workspace, sessions = make_workspace(tmp_path / "ws")
    store = StateStore(tmp_path / "state").open()
    messages = conversation(60, words=40)
    settings = WorkspaceSettings(path=workspace, name="ws", sessions_dir=sessions,
                                 consolidation=ConsolidationSettings(mode="companion"),
                                 llm=LLMSettings(model="none", context_window=200_000))
    runtime = Workspace(settings, store, state_dir=tmp_path / "state", environ={}, home=None, now=datetime.now)
    try:
        tokens.get_encoding.cache_clear()
        path = write_session(sessions, "cli:a", messages)
        runtime.scan_path(path)  # nanobot's budget (~190k tokens) is far: the estimate decides, nothing is counted
        session = runtime.tracker.sessions["cli:a"]
        assert session.tail_tokens == session.unarchived_tokens > 0 and not tokens.encodings_loaded()

        runtime.agent_base_tokens = runtime.agent_flush_threshold() - session.unarchived_tokens  # now it is near
        write_session(sessions, "cli:a", messages + conversation(2, tag="n"))
        runtime.scan_path(path)
        exact = _exact(messages + conversation(2, tag="n"))
        assert session.tail_tokens == exact != session.unarchived_tokens
        assert runtime.agent_tail_tokens("cli:a") == exact + 4 * 62
        assert session.to_json()["unarchived_tokens"] == exact
        counted = dict(session.exact)
        runtime.tracker.count_tail("cli:a")
        assert session.exact == counted  # each message counted once, kept by digest
    finally:
        asyncio.run(runtime.close())
        store.close()
