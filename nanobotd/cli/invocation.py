"""One nanobotctl invocation (client, arguments, streams) handed to every command, so tests run commands
in-process with their own streams and socket."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from nanobotd.cli.client import Client

EXIT_OK, EXIT_DAEMON_ERROR, EXIT_CANNOT_CONNECT = 0, 1, 2
EXIT_BROKEN_PIPE, EXIT_INTERRUPTED = 141, 130


class Invocation:
    """Everything a command needs for one run of nanobotctl: the client, the arguments and where to write."""

    def __init__(self, client: Client, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> None:
        self.client = client
        self.args = args
        self.stdout = stdout
        self.stderr = stderr

    def out(self, text: str = "") -> None:
        """Write one line to this invocation's stdout (the terminal, or a test's buffer)."""
        self.stdout.write(text + "\n")

    def out_lines(self, lines: Iterable[str]) -> None:
        """Write each of *lines* to stdout, so commands can hand over what a renderer returned."""
        for line in lines:
            self.out(line)

    def warn(self, message: str) -> None:
        """Tell the user something on stderr without spoiling stdout for a pipe."""
        self.stderr.write(f"nanobotctl: {message}\n")

    def emit_json(self, data: Any) -> None:
        """Print *data* as indented JSON: what --json promises scripts, still readable by a person."""
        self.out(json.dumps(data, indent=2, ensure_ascii=False))

    def answer(self, data: dict, render: Callable[[dict], Iterable[str]]) -> int:
        """Print the daemon's answer, raw with --json or through *render*; the common end of a command."""
        if self.args.json:
            self.emit_json(data)
        else:
            self.out_lines(render(data))
        return EXIT_OK
