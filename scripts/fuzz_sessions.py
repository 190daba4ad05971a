"""Feed a running nanobotd N hostile session files and check that it archives every readable message.

Usage: python scripts/fuzz_sessions.py [N] [--seed S] [--keep]

A real daemon (offline, owner mode, so it archives by itself) watches a tmp workspace while this writes
files the way nanobot saves them (temp file + rename): truncated lines, invalid UTF-8, deep JSON nesting,
10 MB strings, NULs, wrong types in every field, fake metadata lines, huge `last_archived`. Then every
session is consolidated and the script prints: files fed, daemon alive, messages archived vs messages
readable (counted here by an independent reader; they must be equal), and errors logged. Exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nanobotd.cli.client import CannotConnect, Client, DaemonError  # noqa: E402

BIG_STRING_BYTES = 10 * 1024 * 1024
WRONG_VALUES = [None, 0, -1, 3.5, True, [], {}, ["x"], {"a": 1}, "", "\x00", "x" * 50]


def session_name(key: str) -> str:
    """nanobot's file name for a session key."""
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".jsonl"


def message(rng: random.Random, index: int, big: bool) -> dict:
    """A message, now and then with a wrong type in some field, NULs, or a 10 MB content."""
    record = {"role": rng.choice(["user", "assistant", "tool"]), "content": f"message {index} \x00 {rng.random()}",
              "timestamp": f"2026-11-01T09:{index % 60:02d}:00"}
    if big:
        record["content"] = "B" * BIG_STRING_BYTES
    for field in ("role", "content", "timestamp", "tool_calls", "_command", "_hidden_history", "name"):
        if rng.random() < 0.06:
            record[field] = rng.choice(WRONG_VALUES)
    if rng.random() < 0.05:
        record["content"] = [{"type": "text", "text": "block"}, {"type": "image_url"}, "loose", 5]
    if rng.random() < 0.03:
        record["content"] = nested(rng.randint(50, 400))
    return record


def nested(depth: int) -> list:
    value: list = ["deep"]
    for _ in range(depth):
        value = [value]
    return value


def metadata(rng: random.Random, key: str) -> dict:
    """A metadata record with a mark that may be valid, of a wrong type, negative or huge."""
    mark = rng.choice([0, 1, 2, 3, -4, 10**30, "2", None, True, 2.0])
    record = {"_type": "metadata", "key": key, "created_at": "2026-11-01T09:00:00", "metadata": {}}
    if rng.random() < 0.8:
        record["last_archived"] = mark
    if rng.random() < 0.5:
        record["last_consolidated"] = rng.choice([mark, 1, "x"])
    if rng.random() < 0.1:
        record["key"] = rng.choice(WRONG_VALUES)
    return record


def hostile_lines(rng: random.Random, key: str, big: bool) -> list[bytes]:
    """The lines of one hostile session file (the last may be cut short)."""
    lines = [json.dumps(metadata(rng, key)).encode()]
    count = rng.randint(0, 12)
    for index in range(count):
        roll = rng.random()
        if roll < 0.05:
            lines.append(b"\xff\xfe\xfa invalid utf-8 \x80" + bytes([rng.randrange(256) for _ in range(8)]))
        elif roll < 0.08:
            lines.append(b"[" * rng.randint(2000, 6000))
        elif roll < 0.11:
            lines.append(json.dumps(metadata(rng, key)).encode())  # a fake metadata line mid-file
        elif roll < 0.13:
            lines.append(b"\x00" * rng.randint(1, 40))
        elif roll < 0.15:
            lines.append(json.dumps(rng.choice(WRONG_VALUES)).encode())
        else:
            lines.append(json.dumps(message(rng, index, big and index == 0), ensure_ascii=rng.random() < 0.5).encode())
    if lines and rng.random() < 0.2:
        cut = lines[-1]
        lines[-1] = cut[: rng.randint(0, max(0, len(cut) - 1))]  # a truncated last line
    return lines


def save(folder: Path, name: str, data: bytes) -> None:
    """Whole file to a temp name, then a rename over the real one, as nanobot saves."""
    temp = folder / f".{name}.{os.getpid():x}.tmp"
    temp.write_bytes(data)
    os.replace(temp, folder / name)


def read_back(data: bytes, default_key: str) -> tuple[str, int]:
    """By an independent reader: the session key (the last metadata key wins, as in nanobot) and how many
    messages nanobotd must archive (conversation lines above the agent's mark)."""
    messages, mark, key = [], 0, default_key
    for raw in data.split(b"\n"):
        raw = raw.strip()
        if not raw:
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        if "_type" in record:
            if record.get("_type") == "metadata":
                value = record.get("last_archived", record.get("last_consolidated", 0))
                mark = value if type(value) is int and value > 0 else 0
                key = record["key"] if isinstance(record.get("key"), str) and record["key"] else key
            continue
        if isinstance(record.get("role"), str):
            messages.append(not record.get("_command") and not record.get("_hidden_history"))
    mark = mark if mark <= len(messages) else 0
    return key, sum(1 for index, counts in enumerate(messages) if counts and index >= mark)


def start_daemon(base: Path, workspace: Path) -> tuple[subprocess.Popen, Path, Path]:
    socket_path, log_path = base / "run" / "nanobotd.sock", base / "daemon.log"
    config = base / "nanobotd.toml"
    config.write_text(f'[daemon]\nsocket = "{socket_path}"\nstate_dir = "{base / "state"}"\nreconcile_seconds = 5\n'
                      f'debounce_seconds = 0.3\n\n[consolidation]\nmode = "owner"\nidle_minutes = 600\n\n'
                      f'[[workspaces]]\npath = "{workspace}"\nname = "fuzz"\n')
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "nanobotd.cli.nanobotd", "run", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    return proc, socket_path, log_path


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (DaemonError, CannotConnect, OSError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"fuzz: timed out waiting for {what}")


def feed(sessions: Path, count: int, rng: random.Random) -> tuple[int, set[str]]:
    """Write *count* hostile files; return how many messages they hold that nanobotd must archive, and the
    session keys they name (files whose metadata claim the same key are one session, as in nanobot)."""
    readable, keys = 0, set()
    big_files = set(rng.sample(range(count), k=min(count, max(1, count // 200))))
    for index in range(count):
        key = f"fuzz:{index}"
        data = b"\n".join(hostile_lines(rng, key, index in big_files))
        if rng.random() < 0.8:
            data += b"\n"
        save(sessions, session_name(key), data)
        named, messages = read_back(data, key)
        readable += messages
        keys.add(named)
    return readable, keys


def archive_everything(client: Client, keys: set[str]) -> list[dict]:
    """Wait until every session is tracked, consolidate each, wait until nothing is left unarchived."""
    wait_for(lambda: {row["key"] for row in client.get("/v1/sessions")["sessions"]} >= keys, 600,
             "every session to be tracked")
    time.sleep(3)  # the last debounced events and a reconcile
    for row in client.get("/v1/sessions")["sessions"]:
        if row["unarchived_messages"]:
            client.post("/v1/consolidate", {"session": row["key"]})

    def settled():
        rows = client.get("/v1/sessions")["sessions"]
        running = client.get("/v1/status")["jobs_running"]
        return rows if not running and not any(row["unarchived_messages"] for row in rows) else None

    return wait_for(settled, 900, "every session to be archived")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", nargs="?", type=int, default=1000, help="hostile session files to write")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the tmp folder (workspace, state, log)")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="nbfuzz-", dir="/tmp"))
    workspace, sessions = base / "workspace", base / "workspace" / "sessions"
    sessions.mkdir(parents=True)
    (workspace / "memory").mkdir()
    proc, socket_path, log_path = start_daemon(base, workspace)
    client = Client(socket_path, timeout=60)
    try:
        wait_for(lambda: client.get("/v1/status"), 60, "the daemon to listen")
        started = time.monotonic()
        readable, keys = feed(sessions, args.count, random.Random(args.seed))
        rows = archive_everything(client, keys)
        alive = proc.poll() is None and bool(client.get("/v1/status"))
        status = client.get("/v1/status")["workspaces"][0]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    archived = sum(row["daemon_archived"] for row in rows)
    log = log_path.read_text(errors="replace")
    errors = sum(1 for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line)
    print(f"files fed:            {args.count} ({len(keys)} session keys; seed {args.seed}, "
          f"{time.monotonic() - started:.0f}s)")
    print(f"daemon alive:         {'yes' if alive else 'NO'} (exit {proc.returncode} on SIGTERM)")
    print(f"messages archived:    {archived}")
    print(f"messages readable:    {readable}")
    print(f"corrupt lines:        {status['corrupt_lines']} counted; large messages: {status['large_messages']}")
    print(f"errors logged:        {errors} (scan errors: {status['scan_errors']})")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"kept:                 {base}")
    return 0 if alive and archived == readable and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
