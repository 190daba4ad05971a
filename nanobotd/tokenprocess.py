"""What the child-process modules still share from the token counting process this file once held (it goes once
they start their children elsewhere): the command that runs a child, its framing, and waiting for one to exit."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

EXIT_WAIT_SECONDS = 5.0
LENGTH = struct.Struct("<I")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def worker_command(module: str, entry: str = "serve") -> list[str]:
    """This interpreter serving the daemon on stdin and stdout with *module*'s *entry* ("serve" is handed both
    streams, another entry takes no argument), with this package importable whatever the working directory."""
    call = "serve(sys.stdin.buffer, sys.stdout.buffer)" if entry == "serve" else f"{entry}()"
    bootstrap = (f"import sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r}); from {module} import {entry}; "
                 f"sys.exit({call})")
    return [sys.executable, "-c", bootstrap]


def reap(process: subprocess.Popen, kill: Callable[[str], None], reason: str = "did not exit") -> None:
    """Wait for a child told to go to exit; *kill* it with *reason* when it does not within EXIT_WAIT_SECONDS, then
    wait (no zombie is left)."""
    try:
        process.wait(EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        kill(reason)
        process.wait()


def counting_processes() -> int:
    """Counting processes alive: none (tokens are estimated, and counted exactly in the daemon when needed)."""
    return 0


def encode(item: object) -> bytes:
    """One request or answer as it travels to or from a child: `<I` length, then the pickle (the daemon's own
    child)."""
    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(data)) + data


def read_item(stream: BinaryIO) -> object | None:
    """The next request or answer; None at the end of the stream (a short read at the end is the end too)."""
    head = stream.read(LENGTH.size)
    if head is None or len(head) != LENGTH.size:
        return None
    size = LENGTH.unpack(head)[0]
    data = stream.read(size)
    return pickle.loads(data) if data is not None and len(data) == size else None
