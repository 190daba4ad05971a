"""The chunk-reading process of an archive run without an LLM: what it reads and backs up is exactly what the
daemon reads and backs up itself, the run can be restored from its backups, and a process that dies, hangs or
answers garbage costs only time."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from loguru import logger

from nanobotd.config.schema import LLMSettings, WorkspaceSettings
from nanobotd.jobs.common import JobEnv
from nanobotd.jobs.consolidate import archive as consolidate
from nanobotd.jobs.consolidate import chunks, reader, readworker
from nanobotd.jobs.consolidate.reader import ChunkReader
from nanobotd.llm.client import LLMClient
from nanobotd.memory import history
from nanobotd.memory.transcript import raw_entries
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from nanobotd.tokenprocess import worker_command
from tests.jobs.consolidate.test_archive import NOW, raw_messages_in
from tests.support.fakellm import FakeLLM, Text
from tests.support.observe import pid_exists
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

MESSAGES = conversation(60, words=120, tag="r")  # 30 chunks in a context window of 8,000 tokens


def _context(root: Path, llm: LLMSettings | None = None) -> tuple[JobEnv, Path]:
    workspace, sessions = make_workspace(root)
    llm = llm or LLMSettings(model="none", context_window=8000)
    settings = WorkspaceSettings(path=workspace, name="ws", llm=llm)
    store = StateStore(root / "state").open()
    return JobEnv(settings, store, SessionTracker("ws", store), LLMClient(settings.llm), lambda: NOW), sessions


def _archive(ctx: JobEnv, sessions: Path, messages: list[dict] = MESSAGES) -> tuple[str, dict]:
    ctx.tracker.scan(write_session(sessions, "cli:a", messages))
    run_id = ctx.store.create_run("consolidate", "ws", session_key="cli:a")
    return run_id, asyncio.run(consolidate.consolidate_session(ctx, "cli:a", run_id, reason="manual"))


@pytest.fixture(autouse=True)
def _no_counting_process(monkeypatch):
    """Counting processes other tests keep alive (in this process) do not hold the reading process back."""
    monkeypatch.setattr(chunks, "counting_processes", lambda: 0)


class _Spy:
    """The chunk-reading processes started, and how many chunks each one read."""

    def __init__(self, monkeypatch, *, after_first=None) -> None:
        self.pids: list[int] = []
        self.read = 0
        start, read = ChunkReader.__init__, ChunkReader.read
        spy = self

        def started(handle, *args, **kwargs):
            start(handle, *args, **kwargs)
            spy.pids.append(handle.pid)

        def reading(handle, *args, **kwargs):
            answer = read(handle, *args, **kwargs)
            if answer is not None:
                spy.read += 1
                if spy.read == 1 and after_first is not None:
                    after_first(handle)
            return answer

        monkeypatch.setattr(ChunkReader, "__init__", started)
        monkeypatch.setattr(ChunkReader, "read", reading)


def _every_message_once(ctx: JobEnv, messages: list[dict] = MESSAGES) -> None:
    raw = raw_messages_in(history_entries(ctx.settings.path))
    positions = [raw.index(message["content"]) for message in messages]
    assert positions == sorted(positions), "in order"
    assert all(raw.count(message["content"]) == 1 for message in messages), "archived once"
    assert ctx.tracker.sessions["cli:a"].unarchived_messages == 0
    assert ctx.tracker.spool_plan("cli:a").seqs.tolist() == []


def _without_run(entry: dict) -> dict:
    return {**entry, "nanobotd_span": {**entry["nanobotd_span"], "run": None}}


def test_an_offline_run_of_many_chunks_reads_them_in_a_process_and_writes_what_the_daemon_writes(
        tmp_path, monkeypatch):
    here, here_sessions = _context(tmp_path / "here")
    with monkeypatch.context() as alone:
        alone.setattr(chunks, "READER_MIN_CHUNKS", 10**6)
        _, here_manifest = _archive(here, here_sessions)
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path / "process")
    run_id, manifest = _archive(ctx, sessions)

    assert len(spy.pids) == 1 and spy.read == len(manifest["chunks"]) - 1 == 29, "all but the first chunk"
    assert not pid_exists(spy.pids[0]), "the process exited with the run, and was reaped"
    assert ([_without_run(entry) for entry in history_entries(ctx.settings.path)]
            == [_without_run(entry) for entry in history_entries(here.settings.path)])
    steady = ("seq", "count", "first_digest", "last_digest", "tokens", "outcome", "cursors", "hashes", "done")
    assert ([{key: chunk.get(key) for key in steady} for chunk in manifest["chunks"]]
            == [{key: chunk.get(key) for key in steady} for chunk in here_manifest["chunks"]])
    for chunk, here_chunk in zip(manifest["chunks"], here_manifest["chunks"], strict=True):
        assert Path(chunk["backup"]).read_bytes() == Path(here_chunk["backup"]).read_bytes()
    assert sorted(path.name for path in ctx.store.run_dir(run_id).iterdir()) == [
        f"chunk-{number:03d}.jsonl" for number in range(30)], "no temp file, no backup the manifest does not list"
    _every_message_once(ctx)

    restored = consolidate.restore_consolidation(ctx, ctx.store.get_run(run_id), dry_run=False)
    assert restored["messages"] == len(MESSAGES)
    assert [message.record for _, message, _ in ctx.tracker.pending("cli:a")] == MESSAGES
    assert raw_messages_in(history_entries(ctx.settings.path)) == ""
    here.store.close()
    ctx.store.close()


def test_a_reading_process_killed_mid_run_loses_no_message(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch, after_first=lambda handle: os.kill(handle.pid, signal.SIGKILL))
    ctx, sessions = _context(tmp_path)
    _, manifest = _archive(ctx, sessions)
    assert 1 <= spy.read < len(manifest["chunks"]) - 1, "the chunks after the kill are read in the daemon"
    assert not pid_exists(spy.pids[0])
    _every_message_once(ctx)
    assert all(Path(chunk["backup"]).is_file() for chunk in manifest["chunks"])
    ctx.store.close()


HUNG = "import sys, time; sys.stdin.buffer.read(4); time.sleep(60)"
GARBAGE = ("import sys; sys.stdin.buffer.read(4); sys.stdout.buffer.write(b'\\x05\\x00\\x00\\x00hello');"
           " sys.stdout.flush()")
WRONG = ("import pickle, struct, sys; sys.stdin.buffer.read(4); data = pickle.dumps(['not', 'a', 'chunk']);"
         " sys.stdout.buffer.write(struct.pack('<I', len(data)) + data); sys.stdout.flush(); sys.stdin.read()")
EXITS = "import sys; sys.exit(3)"


@pytest.mark.parametrize("script", [HUNG, GARBAGE, WRONG, EXITS],
                         ids=["hangs", "answers-garbage", "answers-no-chunk", "exits"])
def test_a_process_that_hangs_dies_or_answers_garbage_leaves_every_chunk_to_the_daemon(tmp_path, monkeypatch,
                                                                                         script):
    monkeypatch.setattr(reader, "READ_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(reader, "worker_command", lambda module: [sys.executable, "-c", script])
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path)
    _, manifest = _archive(ctx, sessions)
    assert len(spy.pids) == 1 and spy.read == 0
    assert not pid_exists(spy.pids[0]), "killed (or exited), and reaped"
    assert len(manifest["chunks"]) == 30
    _every_message_once(ctx)
    ctx.store.close()


def test_chunks_asked_from_many_threads_at_once_each_get_their_own_answer(tmp_path):
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES))
    asked = [list(range(first, first + 5)) for first in range(1, 61, 5)]
    requests = [(*ctx.tracker.spooled_rows("cli:a", seqs), tmp_path / f"backup-{number}.jsonl")
                for number, seqs in enumerate(asked)]
    handle = ChunkReader()
    start = threading.Barrier(len(asked))

    def read(number: int):
        (rows, held, shift), backup = requests[number][:3], requests[number][3]
        start.wait()
        return handle.read(held, shift, rows, 4000, backup)

    with ThreadPoolExecutor(len(asked)) as threads:
        answers = list(threads.map(read, reversed(range(len(asked)))))[::-1]
    handle.close()
    assert [answer.seqs for answer in answers] == asked
    assert all(Path(answer.backup) == tmp_path / f"backup-{number}.jsonl" for number, answer in enumerate(answers))
    assert not pid_exists(handle.pid) and handle.process.stdout.closed
    ctx.store.close()


def test_a_run_that_ends_with_chunks_unanswered_kills_its_process_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "worker_command", lambda module: [sys.executable, "-c", HUNG])
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES[:10]))
    rows, held, shift = ctx.tracker.spooled_rows("cli:a", list(range(1, 11)))
    handle = ChunkReader()
    logged: list[str] = []
    sink = logger.add(lambda message: logged.append(str(message)), level="DEBUG")
    try:
        with ThreadPoolExecutor(3) as threads:
            waiting = [threads.submit(handle.read, held, shift, rows, 4000, tmp_path / f"b-{n}") for n in range(3)]
            while handle._asked < 3:
                time.sleep(0.01)
            handle.close()
            assert [read.result() for read in waiting] == [None, None, None]
    finally:
        logger.remove(sink)
    assert any("unanswered: killed" in line for line in logged)
    assert handle.process.returncode == -signal.SIGKILL and handle.process.stdout.closed
    ctx.store.close()


def test_a_run_that_fails_midway_leaves_only_the_backups_it_journalled(tmp_path, monkeypatch):
    real = consolidate.archive_chunks
    failed: list[int] = []

    async def fails_at_the_fourth(ctx, session_key, run_id, group, *args):
        if any(number == 3 for number, _ in group):
            failed.extend(number for number, _ in group)
            raise OSError("disk gone")
        return await real(ctx, session_key, run_id, group, *args)

    monkeypatch.setattr(consolidate, "archive_chunks", fails_at_the_fourth)
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path)
    with pytest.raises(OSError, match="disk gone"):
        _archive(ctx, sessions)
    run = ctx.store.list_runs(kind="consolidate", workspace="ws", limit=1)[0]
    journalled = {Path(chunk["backup"]).name for chunk in run.manifest["chunks"]}
    assert journalled == {f"chunk-{number:03d}.jsonl" for number in range(min(failed))} and spy.read >= 3
    folder = ctx.store.run_dir(run.run_id)
    archiving = {f"chunk-{number:03d}.jsonl" for number in failed}
    assert {path.name for path in folder.iterdir()} <= journalled | archiving, "no backup read ahead"
    assert not pid_exists(spy.pids[0])
    ctx.store.close()


@pytest.mark.parametrize("dies", ["after-its-journal", "after-its-append"])
def test_chunks_appended_together_are_finished_or_rolled_back_together_after_a_crash(tmp_path, monkeypatch, dies):
    real_append = history.append_prepared
    groups: list[set[str]] = []

    def append_then_die(memory_dir, prepared, key, now, before_write=None):
        groups.append({span["first"] for _, span in prepared})
        if len(groups[-1]) < 2:
            return real_append(memory_dir, prepared, key, now, before_write=before_write)

        def journal_then_die(cursors):
            before_write(cursors)
            if dies == "after-its-journal":
                raise KeyboardInterrupt("killed before the append")

        real_append(memory_dir, prepared, key, now, before_write=journal_then_die)
        raise KeyboardInterrupt("killed after the append")

    monkeypatch.setattr(history, "append_prepared", append_then_die)
    ctx, sessions = _context(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        _archive(ctx, sessions)
    monkeypatch.setattr(history, "append_prepared", real_append)
    run = ctx.store.list_runs(kind="consolidate", workspace="ws", limit=1)[0]
    journalled = [chunk for chunk in run.manifest["chunks"] if not chunk.get("done") and chunk.get("cursors")]
    assert len(journalled) == len(groups[-1]) >= 2, "a group of chunks journalled its cursors before one append"
    outcome = consolidate.recover_consolidation(ctx, ctx.store.get_run(run.run_id))
    assert outcome == ("rolled_back" if dies == "after-its-journal" else "recovered")
    run_id = ctx.store.create_run("consolidate", "ws", session_key="cli:a")
    asyncio.run(consolidate.consolidate_session(ctx, "cli:a", run_id, reason="manual"))
    _every_message_once(ctx)
    ctx.store.close()


def test_chunks_left_empty_meanwhile_are_skipped_wherever_they_fall_in_a_group(tmp_path, monkeypatch):
    planned: list = []
    plan, load = consolidate.plan_run, chunks.Chunk.load
    monkeypatch.setattr(consolidate, "plan_run",
                        lambda *args, **kwargs: planned.extend(plan(*args, **kwargs)) or planned)
    empty = {5, 6, 12, 29}  # as if another run had archived them after the plan

    def emptied(chunk, *args):
        return False if any(chunk is planned[number] for number in empty) else load(chunk, *args)

    monkeypatch.setattr(chunks.Chunk, "load", emptied)
    ctx, sessions = _context(tmp_path)
    _, manifest = _archive(ctx, sessions)
    archived = {seq for chunk in manifest["chunks"] for seq in range(chunk["seq"][0], chunk["seq"][1] + 1)}
    skipped = {seq for number in empty for seq in planned[number].planned}
    assert len(manifest["chunks"]) == 26 and archived.isdisjoint(skipped) and len(archived | skipped) == 60
    assert sorted(ctx.tracker.spool_plan("cli:a").seqs.tolist()) == sorted(skipped)
    ctx.store.close()


def test_a_short_run_or_one_with_an_llm_starts_no_process(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path / "short")
    _, manifest = _archive(ctx, sessions, MESSAGES[:10])
    assert 1 < len(manifest["chunks"]) < chunks.READER_MIN_CHUNKS and spy.pids == []
    ctx.store.close()
    with FakeLLM(default=Text("- [durable] noted")) as fake:  # its chunks go to the LLM, read in the daemon
        ctx, sessions = _context(tmp_path / "online", LLMSettings(
            model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5, context_window=8000))
        _, manifest = _archive(ctx, sessions)
        assert len(manifest["chunks"]) == len(fake.requests) == 30
    assert spy.pids == [] and all(chunk["outcome"] == "summarized" for chunk in manifest["chunks"])
    ctx.store.close()


def test_the_worker_reads_held_and_copied_records_as_the_daemon_does_and_says_why_it_cannot(tmp_path):
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES[:12]))
    seqs = list(range(1, 13))
    rows, held, shift = ctx.tracker.spooled_rows("cli:a", seqs)
    assert any(spooldb.held_lines(rows)), "the rows are held: their lines are read from the held version"
    copied = [(*row[:6], row[6] or text, None, None, None)  # as rows copied into the spool look
              for row, (_, _, text) in zip(rows, ctx.tracker.spooled_messages("cli:a", seqs), strict=True)]
    changed = [(*row[:9], "0" * 32) if number == 5 else row for number, row in enumerate(rows)]
    backups = [tmp_path / f"backup-{number}.jsonl" for number in range(4)]
    requests = b"".join(readworker.encode(request) for request in (
        (str(held), shift, rows, 4000, str(backups[0])), (str(held), shift, copied, 4000, str(backups[1])),
        (str(held), shift, changed, 4000, str(backups[2])), (str(tmp_path / "gone"), shift, rows, 4000,
                                                               str(backups[3]))))
    answers = io.BytesIO()
    assert readworker.serve(io.BytesIO(requests), answers) == 0
    answers.seek(0)
    from_held, from_copies, line_changed, unreadable = (readworker.read_item(answers) for _ in range(4))
    assert readworker.read_item(answers) is None

    loaded = ctx.tracker.spooled_messages("cli:a", seqs)
    for answer, backup in ((from_held, backups[0]), (from_copies, backups[1])):
        assert answer.seqs == seqs and answer.digests == [message.digest for _, message, _ in loaded]
        assert answer.tokens == [message.tokens for _, message, _ in loaded]
        entries = raw_entries([message for _, message, _ in loaded], 4000)
        assert answer.entries == [history.prepare_entry(entry) for entry in entries] and len(answer.entries) > 1
        assert answer.backup == str(backup) and backup.read_text() == readworker.backup_text(loaded)
    assert line_changed == "a held line is gone or changed" and not backups[2].exists()
    assert unreadable.startswith("held version unreadable (FileNotFoundError") and not backups[3].exists()
    ctx.store.close()


class _Answers(io.BytesIO):
    """The worker's output, checking as each answer is written that the backup it names is there, whole."""

    def __init__(self) -> None:
        super().__init__()
        self.backups_seen: list[str | None] = []

    def write(self, data) -> int:
        answer = readworker.read_item(io.BytesIO(bytes(data)))
        if isinstance(answer, readworker.ReadChunk):
            path = Path(answer.backup)
            self.backups_seen.append(path.read_text() if path.exists() else None)
        return super().write(data)


def test_a_chunk_is_answered_once_its_backup_is_written_and_one_that_cannot_be_backed_up_says_why(tmp_path):
    """The backups are written by a thread of the worker beside its reading: an answer still comes only once its
    backup is in place, in the order asked; a backup that cannot be written (its folder is a file) is the answer,
    and leaves nothing behind; the chunks after it are answered as before."""
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES[:24]))
    rows, held, shift = ctx.tracker.spooled_rows("cli:a", list(range(1, 25)))
    parts = [rows[start:start + 4] for start in range(0, 24, 4)]
    backups = [tmp_path / f"backup-{number}.jsonl" for number in range(6)]
    (tmp_path / "a-file").write_text("not a folder")
    backups[2] = tmp_path / "a-file" / "backup-2.jsonl"
    answers = _Answers()
    requests = b"".join(readworker.encode((str(held), shift, part, 4000, str(backup)))
                        for part, backup in zip(parts, backups, strict=True))
    assert readworker.serve(io.BytesIO(requests), answers) == 0
    answers.seek(0)
    read = [readworker.read_item(answers) for _ in range(6)]
    assert readworker.read_item(answers) is None
    assert read[2].startswith("FileExistsError") and (tmp_path / "a-file").read_text() == "not a folder"
    done = [answer for answer in read if not isinstance(answer, str)]
    assert [answer.seqs for answer in done] == [[row[2] for row in part] for part in parts[:2] + parts[3:]]
    expected = [readworker.backup_text(ctx.tracker.spooled_messages("cli:a", answer.seqs)) for answer in done]
    assert answers.backups_seen == expected  # each whole, before its answer was written
    assert [Path(answer.backup).read_text() for answer in done] == expected
    ctx.store.close()


def test_a_worker_whose_answers_cannot_be_written_exits(tmp_path):
    """The daemon gone (its end of the answers closed), the worker exits as soon as it has an answer to write,
    however many requests are still coming: its writing thread cannot leave it waiting forever."""
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES[:8]))
    rows, held, shift = ctx.tracker.spooled_rows("cli:a", list(range(1, 9)))
    process = subprocess.Popen(worker_command(reader.WORKER_MODULE), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        process.stdout.close()
        process.stdin.write(readworker.encode((str(held), shift, rows, 4000, str(tmp_path / "backup.jsonl"))))
        process.stdin.flush()
        assert process.wait(timeout=30) == 1  # stdin still open: only the failed answer ended it
        assert b"BrokenPipeError" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.stdin.close()
        process.stderr.close()
    ctx.store.close()


def test_a_long_offline_run_starts_its_process_before_it_plans_and_reads_with_that_one(tmp_path, monkeypatch):
    """Reading a long session's plan takes about as long as the process's start: a run that surely wants one
    (no LLM, every message, READER_MIN_CHUNKS chunks or more of tokens) starts it first, and uses it."""
    events: list[str] = []
    start = ChunkReader.__init__

    def started(handle, *args, **kwargs):
        events.append("process")
        start(handle, *args, **kwargs)

    monkeypatch.setattr(ChunkReader, "__init__", started)
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path)
    plan = ctx.tracker.spool_plan
    monkeypatch.setattr(ctx.tracker, "spool_plan", lambda key: events.append("plan") or plan(key))
    _, manifest = _archive(ctx, sessions)
    assert events == ["process", "plan"] and len(spy.pids) == 1 and not pid_exists(spy.pids[0])
    assert spy.read == len(manifest["chunks"]) - 1 == 29, "the first chunk read here as before, the rest by it"
    _every_message_once(ctx)
    ctx.store.close()


def test_no_process_is_started_early_for_a_run_that_may_not_want_one(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES))
    assert chunks.early_reader(ctx, "cli:a", "budget") is None, "a budget run takes max_rounds chunks at most"
    assert chunks.early_reader(ctx, "cli:a", "manual", vanished_only=True) is None, "only what left the file"
    assert chunks.early_reader(ctx, "cli:unknown", "manual") is None
    with monkeypatch.context() as counting:
        counting.setattr(chunks, "counting_processes", lambda: 1)
        assert chunks.early_reader(ctx, "cli:a", "manual") is None, "not beside a counting process"
    with monkeypatch.context() as fewer:  # the tokens fill fewer chunks than the run would start one for
        fewer.setattr(chunks, "READER_MIN_CHUNKS", 31)
        assert chunks.early_reader(ctx, "cli:a", "manual") is None
    assert spy.pids == []
    ctx.store.close()
    with FakeLLM(default=Text("- [durable] noted")) as fake:
        ctx, sessions = _context(tmp_path / "online", LLMSettings(
            model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5, context_window=8000))
        ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES))
        assert chunks.early_reader(ctx, "cli:a", "manual") is None, "its chunks go to the LLM"
        ctx.store.close()
    assert spy.pids == []


def test_a_process_started_early_that_the_run_does_not_want_is_let_go(tmp_path, monkeypatch):
    """The plan has fewer chunks than the run starts a process for (messages archived since the estimate): the
    process started is let go, and the chunks are read in the daemon."""
    spy = _Spy(monkeypatch)
    ctx, sessions = _context(tmp_path)
    ctx.tracker.scan(write_session(sessions, "cli:a", MESSAGES))
    early = chunks.early_reader(ctx, "cli:a", "manual")
    assert early is not None and spy.pids == [early.pid]
    planned = chunks.plan_chunks(ctx, ctx.tracker.spool_plan("cli:a"))[:chunks.READER_MIN_CHUNKS - 1]

    async def load_all() -> list[bool]:
        loads = chunks.ChunkLoads(ctx, "cli:a", planned, raw_backups=lambda number: tmp_path / f"b-{number}",
                                  started=early)
        try:
            assert loads.reader is None
            return [await loads.take(number) for number in range(len(planned))]
        finally:
            loads.cancel()

    assert asyncio.run(load_all()) == [True] * len(planned) and spy.read == 0
    assert early.closed and early.process.wait(timeout=10) == 0 and not pid_exists(early.pid)
    ctx.store.close()
