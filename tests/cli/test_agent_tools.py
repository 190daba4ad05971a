"""nanobotd/cli/agent_tools.py: the memory tools' arguments and answers, against canned daemon answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobotd.api.app import ApiError, Request
from nanobotd.api.server import ControlServer
from nanobotd.cli import agent_tools
from nanobotd.cli.client import Client
from tests.cli.fakedaemon import ServerThread

BIG_HIT = {"source": "history", "path": "memory/history.jsonl", "line_start": 7, "line_end": 7, "session_key": None,
           "when": "2026-11-20 10:15", "snippet": "short", "text": "word " * 3000, "score": 1.0}


class Canned:
    """A control API answering from a dict per path, recording the queries it got."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.queries: list[dict] = []
        self.router = [("GET", path, self.answer) for path in ("/v1/search", "/v1/context", "/v1/recall")]

    async def answer(self, request: Request) -> dict:
        self.queries.append(dict(request.query))
        answer = self.answers[request.path]
        if callable(answer):
            answer = answer(request)
        if isinstance(answer, ApiError):
            raise answer
        return answer


@pytest.fixture
def serve(socket_path: Path):
    """Start a Canned daemon with the given answers; return a client of it and the daemon."""
    threads = []

    def start(answers: dict) -> tuple[Client, Canned]:
        canned = Canned(answers)
        threads.append(ServerThread(ControlServer(socket_path, canned.router)).__enter__())
        return Client(socket_path, 10, "main"), canned

    yield start
    for thread in threads:
        thread.__exit__(None, None, None)


def test_many_long_hits_stay_under_the_result_cap_and_say_how_many_were_left_out(serve) -> None:
    client, canned = serve({"/v1/search": {"hits": [BIG_HIT] * 20, "degraded": "qmd unavailable"}})
    text, is_error = agent_tools.call_tool(client, "memory_search", {"query": "word", "limit": "50"})
    assert not is_error and len(text) <= agent_tools.MAX_RESULT_CHARS
    assert canned.queries == [{"q": "word", "limit": "20", "workspace": "main"}]
    assert text.startswith("20 memory hit(s) for 'word', best first:\n(search degraded: qmd unavailable)")
    assert "[1] history · memory/history.jsonl lines 7 · 2026-11-20 10:15\nword word" in text
    assert "more hit(s) left out to stay under 15000 characters" in text


def test_a_session_hit_names_its_session_and_messages_and_no_hits_says_so(serve) -> None:
    hit = {"source": "session", "path": "s.jsonl", "session_key": "cli:a", "message_start": 3, "message_end": 8,
           "when": "", "snippet": "we talked\n\n\n\nabout it", "text": ""}
    client, _ = serve({"/v1/search": {"hits": [hit]}})
    assert agent_tools.call_tool(client, "memory_search", {"query": "talk"}) == (
        "1 memory hit(s) for 'talk', best first:\n\n[1] session · session cli:a messages 3-8\nwe talked\n\nabout it",
        False)


def test_empty_answers_tell_the_model_what_to_try(serve) -> None:
    client, _ = serve({"/v1/search": {"hits": []}, "/v1/context": {"text": ""}, "/v1/recall": {"items": []}})
    assert "No memory matches 'zebra'" in agent_tools.call_tool(client, "memory_search", {"query": "zebra"})[0]
    assert "Memory is empty" in agent_tools.call_tool(client, "memory_context", {})[0]
    assert "Nothing recorded for 2026-11-20" in agent_tools.call_tool(client, "memory_recall",
                                                                      {"date": "2026-11-20"})[0]


def test_a_long_context_is_cut_with_a_note_and_the_budget_is_clamped(serve) -> None:
    client, canned = serve({"/v1/context": {"text": "x" * 40_000, "tokens": 9000, "budget_tokens": 3500}})
    text, is_error = agent_tools.call_tool(client, "memory_context",
                                           {"session_key": "telegram:42", "budget_tokens": 99_999})
    assert not is_error and len(text) <= agent_tools.MAX_RESULT_CHARS and text.endswith("to see the rest)")
    assert canned.queries == [{"session": "telegram:42", "budget_tokens": "3500", "workspace": "main"}]


def test_recall_asks_for_the_range_and_passes_on_the_cut_note(serve) -> None:
    items = [{"source": "daily note", "date": "2026-11-18", "path": "memory/2026-11-18.md", "text": "# note\n"},
             {"source": "history", "date": "2026-11-19", "path": "memory/history.jsonl", "text": "met Ann",
              "cursor": 4, "timestamp": "2026-11-19 09:00", "session_key": None}]
    client, canned = serve({"/v1/recall": {"items": items, "note": "cut at 12000 characters; ..."}})
    text, _ = agent_tools.call_tool(client, "memory_recall", {"date": " 2026-11-18 .. 2026-11-19 "})
    assert canned.queries == [{"from": "2026-11-18", "to": "2026-11-19", "max_chars": "12000",
                               "workspace": "main"}]
    assert text == ("Memory recorded on 2026-11-18..2026-11-19 (2 item(s), oldest first):\n\n"
                    "== 2026-11-18 · daily note · memory/2026-11-18.md ==\n# note\n\n"
                    "== 2026-11-19 09:00 · history #4 ==\nmet Ann\n\n(cut at 12000 characters; ...)")


@pytest.mark.parametrize("name, arguments, message", [
    ("memory_search", {}, "the 'query' argument is required"),
    ("memory_search", {"query": "x", "limit": "many"}, "'limit' argument must be a whole number"),
    ("memory_recall", {"date": "yesterday"}, "date must be one day as YYYY-MM-DD"),
    ("memory_recall", {"date": "2026-02-30"}, "date must be one day as YYYY-MM-DD"),
    ("memory_recall", {"date": "2026-01-01..2026-03-01"}, "at most 31 days at a time, not 60"),
    ("memory_search", {"query": "x", "limit": 1e400}, "'limit' argument must be a whole number, not inf"),
    ("memory_search", {"query": "x" * 2001}, "'query' argument is too long (2,001 characters); pass at most 2,000"),
    ("memory_context", {"session_key": "k" * 5000}, "'session_key' argument is too long"),
    ("memory_search", {"query": "x", "workspace": "other"}, "answers only for workspace 'main', not 'other'"),
    ("memory_forget", {}, "unknown tool 'memory_forget'"),
])
def test_bad_arguments_are_tool_errors_that_say_what_to_send(socket_path: Path, name, arguments, message) -> None:
    text, is_error = agent_tools.call_tool(Client(socket_path, 1, "main"), name, arguments)
    assert is_error and message in text


def test_a_daemon_error_is_passed_on_as_a_tool_error(serve) -> None:
    client, _ = serve({"/v1/recall": ApiError(400, "bad_param", "ask for at most 31 days at a time")})
    assert agent_tools.call_tool(client, "memory_recall", {"date": "2026-11-20"}) == (
        "nanobotd could not answer: ask for at most 31 days at a time", True)


def test_a_history_hit_keeps_its_file_and_line_beside_its_session_and_a_short_date(serve) -> None:
    hit = {"source": "history", "path": "memory/history.jsonl", "line_start": 4, "line_end": 4,
           "session_key": "telegram:9", "when": "2026-11-20T10:15:00", "text": "- [durable] tea at four"}
    client, _ = serve({"/v1/search": {"hits": [hit]}})
    text, _ = agent_tools.call_tool(client, "memory_search", {"query": "tea"})
    assert "[1] history · memory/history.jsonl lines 4 (session telegram:9) · 2026-11-20 10:15\n" in text


def test_a_session_the_daemon_does_not_know_yet_gets_the_context_without_it(serve) -> None:
    def context(request: Request):
        if request.query.get("session"):
            return ApiError(404, "unknown_session", "no session 'cli:new'")
        return {"text": "# Memory", "tokens": 3, "budget_tokens": 3500}

    client, canned = serve({"/v1/context": context})
    text, is_error = agent_tools.call_tool(client, "memory_context", {"session_key": "cli:new"})
    assert not is_error and text.startswith("# Memory")
    assert [query.get("session") for query in canned.queries] == ["cli:new", None]
