"""nanobotd/daemon/handlers/search.py: the recall endpoint, served on a real socket over one workspace."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanobotd.api.server import ControlServer
from nanobotd.cli.client import Client, DaemonError
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers import search
from nanobotd.daemon.handlers.common import bind
from tests.cli.fakedaemon import ServerThread


@pytest.fixture
def memory(tmp_path: Path) -> Path:
    folder = tmp_path / "workspace" / "memory"
    (folder / "archive").mkdir(parents=True)
    (folder / "2026-11-20.md").write_text("# 2026-11-20\n\n## Decisions\n- Ship kestrel on Friday.\n")
    (folder / "archive" / "2026-11-18.md").write_text("# 2026-11-18\n\n## Topics\n- Venue booked.\n")
    (folder / "history.jsonl").write_text(json.dumps(
        {"cursor": 3, "timestamp": "2026-11-19 08:30", "content": "Discussed tea.", "session_key": "cli:a"}) + "\n")
    return folder


@pytest.fixture
def socket_path():
    """A socket path under /tmp, short enough for AF_UNIX whatever the test's name."""
    base = Path(tempfile.mkdtemp(prefix="nbr-", dir="/tmp"))
    yield base / "run" / "nanobotd.sock"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def client(memory: Path, socket_path: Path):
    """The real search handlers behind a real control server, over a workspace reduced to its memory folder."""
    workspace = SimpleNamespace(name="ws", env=SimpleNamespace(memory_dir=memory))
    with ThreadPoolExecutor(1) as executor:
        core = Core(config=None, store=None, executor=executor, scheduler=None, workspaces={"ws": workspace})
        with ServerThread(ControlServer(socket_path, bind(core, search.ROUTES))):
            yield Client(socket_path, timeout=10)


def test_recall_of_one_day_returns_its_note(client: Client) -> None:
    answer = client.get("/v1/recall", {"from": "2026-11-20"})
    assert (answer["workspace"], answer["from"], answer["to"], answer["truncated"]) == (
        "ws", "2026-11-20", "2026-11-20", False)
    assert [(item["source"], item["path"]) for item in answer["items"]] == [("daily note", "memory/2026-11-20.md")]
    assert "Ship kestrel on Friday." in answer["items"][0]["text"]


def test_recall_of_a_range_returns_archived_notes_and_history_by_day(client: Client) -> None:
    answer = client.get("/v1/recall", {"from": "2026-11-18", "to": "2026-11-20"})
    assert [(item["date"], item["source"]) for item in answer["items"]] == [
        ("2026-11-18", "archived note"), ("2026-11-19", "history"), ("2026-11-20", "daily note")]
    assert answer["items"][1]["text"] == "Discussed tea." and answer["items"][1]["cursor"] == 3


@pytest.mark.parametrize("query, message", [
    ({}, "'from' is required"),
    ({"from": "2026-11-31"}, "must be a date as YYYY-MM-DD"),
    ({"from": "20261120"}, "must be a date as YYYY-MM-DD"),
    ({"from": "2026-11-20", "to": "2026-11-19"}, "'to' must not be before 'from'"),
    ({"from": "2026-01-01", "to": "2026-03-01"}, "at most 31 days"),
    ({"from": "2026-11-20", "max_chars": "10"}, "'max_chars' must be in"),
])
def test_recall_refuses_bad_dates_with_a_clear_message(client: Client, query: dict, message: str) -> None:
    with pytest.raises(DaemonError) as refused:
        client.get("/v1/recall", query)
    assert refused.value.status == 400 and message in refused.value.message


class StandInQmd:
    """The QMD backend's interface, answering with canned hits or failing like a slow qmd does."""

    def __init__(self, hits=None, error=None):
        self.hits, self.error, self.queries = hits or [], error, []

    async def search(self, query, *, limit, mode):
        self.queries.append(query)
        if self.error is not None:
            raise self.error
        return self.hits[:limit]


@pytest.fixture
def searchable(tmp_path: Path, socket_path: Path):
    """The search handlers over a real builtin index of a workspace; the QMD backend is set per test."""
    from datetime import datetime

    from nanobotd.config.schema import ContextSettings, SearchSettings
    from nanobotd.index.builtin import BuiltinIndex
    from tests.support.workspace import make_workspace, write_session

    root, sessions = make_workspace(tmp_path / "ws")
    write_session(sessions, "telegram:3", [{"role": "user", "content": "the heron statue hides the key",
                                             "timestamp": "2026-11-20T10:15:00"}])
    index = BuiltinIndex(root, tmp_path / "index.db", sessions, clock=lambda: datetime(2026, 11, 22, 12, 0))
    index.refresh()
    workspace = SimpleNamespace(name="ws", index=index, qmd=None, settings=SimpleNamespace(
        path=root, search=SearchSettings(backend="qmd"), context=ContextSettings()))
    with ThreadPoolExecutor(1) as executor:
        core = Core(config=None, store=None, executor=executor, scheduler=None, workspaces={"ws": workspace})
        with ServerThread(ControlServer(socket_path, bind(core, search.ROUTES))):
            yield Client(socket_path, timeout=10), workspace
    index.close()


def test_a_slow_qmd_is_answered_by_the_builtin_index_and_the_reply_names_it(searchable) -> None:
    from nanobotd.index.qmdproc import QmdTimeout

    client, workspace = searchable
    workspace.qmd = StandInQmd(error=QmdTimeout("qmd search timed out after 3s"))
    answer = client.get("/v1/search", {"q": "heron key"})
    assert answer["backend"] == "builtin" and "builtin index answered" in answer["fallback"]
    assert answer["degraded"] == "qmd search timed out after 3s; answered by the builtin index"
    [hit] = answer["hits"]
    assert (hit["session_key"], hit["message_start"], hit["when"]) == ("telegram:3", 0, "2026-11-20T10:15:00")
    assert 0.5 < hit["score"] <= 1.0


def test_context_uses_the_configured_backend_and_qmd_hits_get_meaningful_scores(searchable) -> None:
    from nanobotd.index.hit import SearchHit

    client, workspace = searchable
    qmd_hit = SearchHit(source="note", path="memory/2026-11-21.md", snippet="heron sightings", score=0.0,
                        text="## Topics\n- heron sightings by the lake", when="2026-11-21", backend="qmd")
    workspace.qmd = StandInQmd(hits=[qmd_hit])

    answer = client.get("/v1/context", {"query": "heron sightings"})
    searched = client.get("/v1/search", {"q": "heron sightings"})

    assert workspace.qmd.queries == ["heron sightings", "heron sightings"]
    assert answer["search"] == {"backend": "qmd"} and "heron sightings by the lake" in answer["text"]
    assert searched["hits"][0]["score"] > 0.5


def test_min_score_drops_weak_hits_and_a_bad_value_is_refused(searchable) -> None:
    client, _ = searchable
    assert client.get("/v1/search", {"q": "heron kestrel"})["hits"]
    assert client.get("/v1/search", {"q": "zebra heron", "min_score": "0.9"})["hits"] == []
    with pytest.raises(DaemonError) as refused:
        client.get("/v1/search", {"q": "heron", "min_score": "2"})
    assert "'min_score' must be a number in 0..1" in refused.value.message
