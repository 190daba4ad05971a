"""fsio against real file systems: symlink escapes, full disks, torn lines, FIFOs and devices."""

from __future__ import annotations

import errno
import os
import resource
import signal
import threading
import time
from pathlib import Path

import pytest

from nanobotd import fsio


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file outside the workspace that an escaping write would change."""
    target = tmp_path / "outside" / "secret.txt"
    target.parent.mkdir()
    target.write_bytes(b"untouched\n")
    return target


@pytest.fixture
def workspace(tmp_path) -> Path:
    folder = tmp_path / "workspace"
    (folder / "memory").mkdir(parents=True)
    return folder


def test_an_append_through_a_symlink_leading_outside_the_workspace_is_refused(workspace, outside):
    link = workspace / "memory" / "history.jsonl"
    link.symlink_to(outside)
    with pytest.raises(fsio.UnsafePath, match="outside"):
        fsio.append_record(link, b'{"cursor": 1}\n', root=workspace)
    assert outside.read_bytes() == b"untouched\n"
    assert link.is_symlink()


def test_a_write_under_a_symlinked_folder_leading_outside_is_refused(workspace, outside):
    archive = workspace / "memory" / "archive"
    archive.symlink_to(outside.parent, target_is_directory=True)
    with pytest.raises(fsio.UnsafePath):
        fsio.atomic_write(archive / "2026-01-01.md", "note", root=workspace)
    with pytest.raises(fsio.UnsafePath):
        with fsio.file_lock(archive / ".lock", root=workspace):
            pass
    assert sorted(path.name for path in outside.parent.iterdir()) == ["secret.txt"]


def test_a_symlink_that_stays_inside_the_workspace_is_written_through(workspace):
    real = workspace / "memory" / "real.jsonl"
    real.write_bytes(b"a\n")
    link = workspace / "memory" / "history.jsonl"
    link.symlink_to(real)
    fsio.append_record(link, b"b\n", root=workspace)
    assert real.read_bytes() == b"a\nb\n"


def test_an_append_that_fills_a_real_disk_leaves_the_file_as_it_was(tiny_tmpfs):
    path = tiny_tmpfs / "history.jsonl"
    path.write_bytes(b'{"cursor": 1, "content": "kept"}\n' * 100)
    before = path.read_bytes()
    with pytest.raises(OSError) as caught:
        fsio.append_record(path, b"x" * 200_000 + b"\n")
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == ["history.jsonl"]


def test_an_append_over_the_file_size_limit_is_cut_back_off(tmp_path):
    """RLIMIT_FSIZE makes the kernel fail the write part-way (EFBIG) without any mount, in a forked child."""
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"line\n" * 10)
    pid = os.fork()
    if pid == 0:  # child: only os calls, then _exit with a code the parent reads
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
            fsio.append_record(path, b"y" * 10_000 + b"\n")
        except OSError as exc:
            code = 0 if exc.errno == errno.EFBIG else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert path.read_bytes() == b"line\n" * 10


def test_a_torn_last_line_moves_to_a_torn_side_file(workspace):
    path = workspace / "memory" / "history.jsonl"
    path.write_bytes(b'{"cursor": 1}\n{"cursor": 2, "cont')
    moved = fsio.repair_torn_tail(path, root=workspace, is_whole=lambda line: line.endswith(b"}"))
    assert moved == len(b'{"cursor": 2, "cont')
    assert path.read_bytes() == b'{"cursor": 1}\n'
    assert (workspace / "memory" / "history.jsonl.torn").read_bytes() == b'{"cursor": 2, "cont\n'


def test_a_whole_last_line_without_its_newline_only_gets_the_newline(workspace):
    path = workspace / "memory" / "history.jsonl"
    path.write_bytes(b'{"cursor": 1}\n{"cursor": 2}')
    assert fsio.repair_torn_tail(path, root=workspace, is_whole=lambda line: line.endswith(b"}")) == 0
    assert path.read_bytes() == b'{"cursor": 1}\n{"cursor": 2}\n'
    assert not (workspace / "memory" / "history.jsonl.torn").exists()


def test_a_file_ending_in_a_newline_is_left_alone(workspace):
    path = workspace / "memory" / "history.jsonl"
    path.write_bytes(b'{"cursor": 1}\n')
    assert fsio.repair_torn_tail(path, root=workspace) == 0
    assert path.read_bytes() == b'{"cursor": 1}\n'


def test_opening_a_fifo_is_refused_at_once_instead_of_blocking(tmp_path):
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    outcome: list = []
    reader = threading.Thread(target=lambda: outcome.append(_try_open(fifo)), daemon=True)
    started = time.monotonic()
    reader.start()
    reader.join(timeout=5)
    assert not reader.is_alive(), "open_regular blocked on a FIFO"
    assert time.monotonic() - started < 2
    assert isinstance(outcome[0], fsio.NotRegularFile) and "FIFO" in str(outcome[0])


def test_a_symlink_to_dev_zero_is_refused_before_reading(tmp_path):
    link = tmp_path / "session.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(fsio.NotRegularFile, match="symlink"):
        fsio.open_regular(link)
    with pytest.raises(fsio.NotRegularFile, match="character device"):
        fsio.read_text_lossy(link)  # memory files may be links, but only to regular files


def test_a_regular_file_opens_and_reads(tmp_path):
    path = tmp_path / "note.md"
    path.write_bytes(b"hello")
    with fsio.open_regular(path) as handle:
        assert handle.read() == b"hello"


def _try_open(path: Path):
    try:
        fsio.open_regular(path).close()
    except OSError as exc:
        return exc
    return None


def test_an_atomic_writer_left_without_commit_leaves_the_old_file_and_no_temp_file(tmp_path):
    folder = tmp_path / "memory"
    folder.mkdir()
    target = folder / "history.jsonl"
    target.write_bytes(b"old\n")
    with fsio.AtomicWriter(target) as writer:
        writer.write(b"new, ")
        writer.write(b"in pieces\n")
    assert target.read_bytes() == b"old\n" and list(folder.iterdir()) == [target]
    with pytest.raises(RuntimeError), fsio.AtomicWriter(target) as writer:
        writer.write(b"cut short")
        raise RuntimeError("failed half way")
    assert target.read_bytes() == b"old\n" and list(folder.iterdir()) == [target]
    target.chmod(0o600)
    with fsio.AtomicWriter(target) as writer:
        writer.write(b"new, ")
        writer.write(b"in pieces\n")
        writer.commit()
    assert target.read_bytes() == b"new, in pieces\n" and list(folder.iterdir()) == [target]
    assert target.stat().st_mode & 0o777 == 0o600


def test_sync_folder_makes_a_group_of_files_durable_at_once_and_names_a_folder_it_cannot_open(tmp_path):
    folder = tmp_path / "held"
    folder.mkdir()
    files = [folder / f"{number}.1" for number in range(3)]
    for path in files:
        path.write_bytes(b"line\n")
    fsio.sync_folder(folder, files)
    assert [path.read_bytes() for path in files] == [b"line\n"] * 3
    with pytest.raises(FileNotFoundError):
        fsio.sync_folder(tmp_path / "missing", [])


def test_overwrite_counter_rewrites_the_file_in_place(tmp_path):
    path = tmp_path / ".cursor"
    path.write_text("123\n")
    inode = path.stat().st_ino
    fsio.overwrite_counter(path, "124", root=tmp_path)
    assert path.read_text() == "124"
    assert path.stat().st_ino == inode  # no rename: the same file


def test_overwrite_counter_creates_a_missing_file_and_replaces_a_symlink(tmp_path):
    fsio.overwrite_counter(tmp_path / ".cursor", "7", root=tmp_path)
    assert (tmp_path / ".cursor").read_text() == "7"
    target = tmp_path / "elsewhere"
    target.write_text("1")
    (tmp_path / "linked").symlink_to(target)
    fsio.overwrite_counter(tmp_path / "linked", "8", root=tmp_path)
    assert not (tmp_path / "linked").is_symlink()
    assert (tmp_path / "linked").read_text() == "8"
    assert target.read_text() == "1"


def test_overwrite_counter_leaves_a_hard_linked_file_alone(tmp_path):
    path, other = tmp_path / ".cursor", tmp_path / "other"
    path.write_text("5")
    os.link(path, other)
    fsio.overwrite_counter(path, "6", root=tmp_path)
    assert path.read_text() == "6"
    assert other.read_text() == "5"
