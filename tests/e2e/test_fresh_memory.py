"""Memory written beside the daemon (by nanobot's file tools, an editor, a script) is searchable within seconds.

nanobot's write_file / edit_file tools write memory/MEMORY.md with Path.write_text (truncate and write in
place); other writers replace files atomically or through an editor's swap files. The periodic reconcile is
set far away (an hour) in the watcher scenarios, so only the watch on the memory folders can make a change
searchable; the reconcile scenario drops the memory events through a named fault point instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.daemonproc import shared_daemon
from tests.support.workspace import make_workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
QMD_BINARY = REPO_ROOT / ".qmd-prefix" / "bin" / "qmd"
FOUND_SECONDS = 30  # a bound, not a figure: a change shows up after the index debounce (0.2 s here)
NO_RECONCILE = 3600
BACKENDS = [
    "builtin",
    pytest.param("qmd", marks=pytest.mark.skipif(not os.access(QMD_BINARY, os.X_OK),
                                                 reason=f"qmd not installed at {QMD_BINARY}")),
]


def search_config(backend: str) -> str:
    return f"""
[search]
backend = "{backend}"
debounce_seconds = 0.2
qmd_command = "{QMD_BINARY}"
"""


def started(proc, workspace: Path, backend: str):
    """*proc* started, once its index (and QMD collection) holds the workspace's first memory."""
    proc.workspace, proc.backend = workspace, backend
    proc.memory = workspace / "memory" / "MEMORY.md"
    proc.start()
    proc.wait_for(lambda: memory_hits(proc, "kestrel") and settled(proc), timeout=60)
    return proc


def start_daemon(tmp_path, daemon_process, backend: str, *, reconcile_seconds: float = NO_RECONCILE,
                 env: dict | None = None):
    """A daemon whose index (and QMD collection) already holds the workspace's first memory."""
    workspace, _ = make_workspace(tmp_path, layout="current")
    proc = daemon_process(workspace, reconcile_seconds=reconcile_seconds, env=env, extra_config=search_config(backend))
    return started(proc, workspace, backend)


def settled(daemon) -> bool:
    """The start-up refresh (and QMD's first update) ran and nothing waits for the index."""
    search = daemon.ctl_json("status")["workspaces"][0]["search"]
    qmd = search.get("qmd") or {"pending_changes": 0, "updating": False}
    return (search["refreshes"] >= 1 and not search["pending_changes"] and not search["refreshing"]
            and not qmd["pending_changes"] and not qmd["updating"])


def memory_hits(daemon, query: str, name: str = "MEMORY.md") -> list[dict] | None:
    """Hits in *name* for *query* from the backend the daemon is configured with (None when another answered:
    QMD's own collection must answer, not the builtin index it falls back to)."""
    answer = daemon.ctl_json("search", query)
    if answer["backend"] != daemon.backend:
        return None
    return [hit for hit in answer["hits"] if hit["path"].endswith(name)]


def fact(place: str) -> str:
    """A fact no other test writes, found by the query `PLACE trip`."""
    return f"\n## Travel\n- The {place} trip starts on the ninth of March.\n"


def found(daemon, place: str = "zanzibar", name: str = "MEMORY.md") -> list[dict]:
    return daemon.wait_for(lambda: [hit for hit in memory_hits(daemon, f"{place} trip", name) or []
                                    if place in hit["snippet"] or place in (hit.get("text") or "")],
                           timeout=FOUND_SECONDS)


@pytest.fixture(scope="module", params=BACKENDS)
def watching(request, tmp_path_factory):
    """One daemon per backend for the watcher scenarios (no reconcile): each changes memory with a fact of its
    own and waits until nothing waits for the index first."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    workspace, _ = make_workspace(tmp_path, layout="current")
    proc = shared_daemon(tmp_path, workspace, reconcile_seconds=NO_RECONCILE, extra_config=search_config(request.param))
    try:
        yield started(proc, workspace, request.param)
    finally:
        proc.kill()


@pytest.fixture
def daemon(watching):
    watching.wait_for(lambda: settled(watching), timeout=60)
    return watching


def test_memory_written_in_place_as_nanobot_writes_it_is_found(daemon):
    inode = daemon.memory.stat().st_ino
    daemon.memory.write_text(daemon.memory.read_text() + fact("zanzibar"), encoding="utf-8")  # nanobot's write_file
    assert daemon.memory.stat().st_ino == inode
    assert found(daemon, "zanzibar")[0]["path"].endswith("memory/MEMORY.md")


def test_memory_replaced_atomically_is_found(daemon):
    temporary = daemon.memory.with_name(".MEMORY.md.tmp")
    temporary.write_text(daemon.memory.read_text() + fact("okavango"))
    os.replace(temporary, daemon.memory)
    assert found(daemon, "okavango")


def test_memory_saved_through_an_editors_swap_files_is_found(daemon):
    folder, text = daemon.memory.parent, daemon.memory.read_text()
    swap = folder / ".MEMORY.md.swp"
    swap.write_bytes(b"b0VIM 9.0\0" * 20)
    probe = folder / "4913"  # vim checks it may create files in the folder
    probe.write_text("")
    probe.unlink()
    backup = folder / "MEMORY.md~"
    os.rename(daemon.memory, backup)
    daemon.memory.write_text(text + fact("patagonia"))
    backup.unlink()
    swap.unlink()
    assert found(daemon, "patagonia")


def test_a_new_daily_note_is_found(daemon):
    note = daemon.memory.with_name(time.strftime("%Y-%m-%d") + ".md")
    note.write_text("# Notes\n" + fact("tasmania"))
    assert found(daemon, "tasmania", note.name)


def test_deleted_memory_is_no_longer_found(daemon):
    before = daemon.memory.read_text()
    daemon.memory.write_text(before + fact("svalbard"))
    found(daemon, "svalbard")
    daemon.memory.unlink()
    try:
        daemon.wait_for(lambda: memory_hits(daemon, "svalbard trip") == [] and memory_hits(daemon, "kestrel") == [],
                        timeout=FOUND_SECONDS)
    finally:
        daemon.memory.write_text(before)  # for whichever test comes next


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_reconcile_finds_a_memory_change_the_watcher_missed(tmp_path, daemon_process, backend):
    daemon = start_daemon(tmp_path, daemon_process, backend, reconcile_seconds=1,
                          env={"NANOBOTD_FAULTS": "watcher.drop_memory_events=drop"})
    daemon.memory.write_text(daemon.memory.read_text() + fact("zanzibar"))
    assert found(daemon)
    assert "changed unseen (memory/MEMORY.md)" in daemon.log()


def test_a_memory_file_kept_elsewhere_through_a_symlink_is_refreshed_by_the_reconcile(tmp_path, daemon_process):
    """Dotfiles setups link MEMORY.md from another folder: its writes land where no watch is, so the reconcile's
    check (stat follows the link) must find them, and the refresh must re-read the file by its name."""
    elsewhere = tmp_path / "dotfiles" / "MEMORY.md"
    elsewhere.parent.mkdir()
    workspace, _ = make_workspace(tmp_path, layout="current")
    memory = workspace / "memory" / "MEMORY.md"
    elsewhere.write_text(memory.read_text())
    memory.unlink()
    memory.symlink_to(elsewhere)
    daemon = daemon_process(workspace, reconcile_seconds=1, extra_config="[search]\ndebounce_seconds = 0.2\n")
    daemon.workspace, daemon.backend = workspace, "builtin"
    daemon.start()
    daemon.wait_for(lambda: memory_hits(daemon, "kestrel") and settled(daemon), timeout=60)
    elsewhere.write_text(elsewhere.read_text() + fact("zanzibar"))
    assert found(daemon)[0]["path"] == "memory/MEMORY.md"


def test_memory_is_found_when_the_skill_file_cannot_be_written(tmp_path, daemon_process):
    """`skills` is a file of the user's, not a folder (or the disk is full): the skill file cannot be written. The
    workspace still opens, so its index is refreshed (before, the failed write ended the opening: nothing was ever
    found)."""
    workspace, _ = make_workspace(tmp_path, layout="current")
    (workspace / "skills").write_text("my own list of skills\n")
    daemon = daemon_process(workspace, reconcile_seconds=1, extra_config="[search]\ndebounce_seconds = 0.2\n")
    daemon.workspace, daemon.backend = workspace, "builtin"
    daemon.start()
    daemon.wait_for(lambda: memory_hits(daemon, "kestrel") and settled(daemon), timeout=60)
    (workspace / "memory" / "MEMORY.md").write_text((workspace / "memory" / "MEMORY.md").read_text() + fact("zanzibar"))
    assert found(daemon)[0]["path"] == "memory/MEMORY.md"
    assert (workspace / "skills").read_text() == "my own list of skills\n"
    assert "the memory-search skill file cannot be written" in daemon.log()
