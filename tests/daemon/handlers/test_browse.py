"""nanobotd/daemon/handlers/browse.py: what the web page reads, served on a real socket over one workspace."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanobotd.api.server import ControlServer
from nanobotd.cli.client import Client, DaemonError
from nanobotd.config.schema import ContextSettings
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers import browse
from nanobotd.daemon.handlers.common import bind
from nanobotd.state import metrics
from nanobotd.state.store import StateStore
from tests.cli.fakedaemon import ServerThread

NOW = datetime(2026, 11, 20, 12, 0)


def entry(cursor: int, stamp: datetime, content: str) -> str:
    return json.dumps({"cursor": cursor, "timestamp": stamp.strftime("%Y-%m-%d %H:%M"), "content": content}) + "\n"


@pytest.fixture
def workspace_dir(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    memory = root / "memory"
    (memory / "archive").mkdir(parents=True)
    (root / "SOUL.md").write_text("# Soul\n\nCalm.\n")
    (root / "USER.md").write_text("# User\n\n- Likes tea.\n")
    (memory / "MEMORY.md").write_text("# Memory\n\n" + "- The backup host is osprey.\n" * 40)
    (memory / "2026-11-20.md").write_text("# 2026-11-20\n\n## Decisions\n- Ship kestrel.\n")
    (memory / "archive" / "2026-11-02.md").write_text("# 2026-11-02\n\n## Topics\n- Venue.\n")
    (memory / "notes.md").write_text("not a daily note\n")
    # 300 entries, two a day back from NOW, plus a torn line the readers skip
    lines = [entry(cursor, NOW - timedelta(hours=12 * (300 - cursor)), f"entry {cursor}") for cursor in range(1, 301)]
    lines.insert(150, "{torn\n")
    (memory / "history.jsonl").write_text("".join(lines))
    return root


@pytest.fixture
def socket_path():
    """A socket path under /tmp, short enough for AF_UNIX whatever the test's name."""
    base = Path(tempfile.mkdtemp(prefix="nbb-", dir="/tmp"))
    yield base / "run" / "nanobotd.sock"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def store(tmp_path: Path):
    state = StateStore(tmp_path / "state", clock=NOW.timestamp).open()
    yield state
    state.close()


@pytest.fixture
def client(workspace_dir: Path, store: StateStore, socket_path: Path):
    """The real browse handlers behind a real control server."""
    settings = SimpleNamespace(path=workspace_dir, context=ContextSettings(max_chars=500, total_max_chars=800))
    workspace = SimpleNamespace(name="ws", settings=settings, env=SimpleNamespace(memory_dir=workspace_dir / "memory"))
    config = SimpleNamespace(daemon=SimpleNamespace(timezone=None))
    with ThreadPoolExecutor(1) as executor:
        core = Core(config=config, store=store, executor=executor, scheduler=None, workspaces={"ws": workspace},
                    clock=NOW.timestamp)
        with ServerThread(ControlServer(socket_path, bind(core, browse.ROUTES))):
            yield Client(socket_path, timeout=10)


def test_memory_files_gives_the_bootstrap_files_with_their_caps_and_the_note_days(client: Client) -> None:
    answer = client.get("/v1/memory-files")
    files = {item["path"]: item for item in answer["files"]}
    assert list(files) == ["SOUL.md", "USER.md", "memory/MEMORY.md"]
    assert "Likes tea." in files["USER.md"]["text"]
    assert files["memory/MEMORY.md"]["chars"] == len("# Memory\n\n" + "- The backup host is osprey.\n" * 40)
    assert (answer["max_chars"], answer["total_max_chars"]) == (500, 800)
    assert answer["total_chars"] == sum(item["chars"] for item in files.values())
    assert answer["notes"] == [{"date": "2026-11-20", "archived": False}, {"date": "2026-11-02", "archived": True}]


def test_history_pages_go_back_from_the_newest_entry_by_cursor(client: Client) -> None:
    first = client.get("/v1/history", {"limit": 100})
    assert [item["cursor"] for item in first["entries"]] == list(range(300, 200, -1))
    assert first["next_before"] == 201
    second = client.get("/v1/history", {"limit": 100, "before": first["next_before"]})
    assert [item["cursor"] for item in second["entries"]] == list(range(200, 100, -1))  # the torn line skipped
    last = client.get("/v1/history", {"limit": 100, "before": 51})
    assert [item["cursor"] for item in last["entries"]] == list(range(50, 0, -1)) and last["next_before"] is None


def test_daily_series_counts_outcomes_and_history_entries_per_day(client: Client, store: StateStore) -> None:
    store.record_outcome("consolidate", "ws", "written")
    store.record_outcome("consolidate", "ws", "raw_fallback", reason="LLM timed out")
    store.record_outcome("flush", "ws", "no_change")
    store.record_outcome("consolidate", "other", "error")
    answer = client.get("/v1/metrics/daily", {"days": 3})
    assert answer["from"] == "2026-11-18"
    assert answer["history_entries"] == {"2026-11-18": 2, "2026-11-19": 2, "2026-11-20": 2}
    assert sorted((row["kind"], row["outcome"], row["count"]) for row in answer["outcomes"]) == [
        ("consolidate", "raw_fallback", 1), ("consolidate", "written", 1), ("flush", "no_change", 1)]
    assert answer["last_outcomes"]["consolidate"]["outcome"] == "raw_fallback"
    assert answer["last_outcomes"]["consolidate"]["reason"] == "LLM timed out"


def test_daily_series_refuses_too_many_days(client: Client) -> None:
    with pytest.raises(DaemonError) as refused:
        client.get("/v1/metrics/daily", {"days": 400})
    assert refused.value.status == 400 and "'days' must be in" in refused.value.message


def test_memory_files_gives_one_days_notes_and_latest_is_the_newest_day(client: Client) -> None:
    newest = client.get("/v1/memory-files", {"day": "latest"})
    assert newest["day"] == "2026-11-20"
    assert [(note["path"], "Ship kestrel." in note["text"]) for note in newest["day_notes"]] == [
        ("memory/2026-11-20.md", True)]
    archived = client.get("/v1/memory-files", {"day": "2026-11-02"})["day_notes"]
    assert [(note["path"], note["archived"]) for note in archived] == [("memory/archive/2026-11-02.md", True)]
    assert client.get("/v1/memory-files", {"day": "2026-11-03"})["day_notes"] == []
    with pytest.raises(DaemonError) as refused:
        client.get("/v1/memory-files", {"day": "../etc"})
    assert refused.value.status == 400


def test_daily_series_gives_the_daily_samples_of_the_window(client: Client, store: StateStore) -> None:
    """The samples of archived twice and index size in the window, this workspace's only; a day without one has
    no row (the page draws a gap)."""
    for day, twice, units in (("2026-11-17", 9, 900), ("2026-11-18", 1, 100), ("2026-11-20", 2, 250)):
        metrics.record_daily_sample(store, "ws", day, archived_twice=twice, index_units=units,
                                    index_db_bytes=units * 4096)
    metrics.record_daily_sample(store, "other", "2026-11-19", archived_twice=5, index_units=5, index_db_bytes=5)
    answer = client.get("/v1/metrics/daily", {"days": 3})
    assert answer["samples"] == [
        {"day": "2026-11-18", "archived_twice": 1, "index_units": 100, "index_db_bytes": 409600},
        {"day": "2026-11-20", "archived_twice": 2, "index_units": 250, "index_db_bytes": 1024000},
    ]
