"""Waiting for runs to end: poll the daemon, keep one progress line on stderr when it is a terminal (pipes see
only the result); Ctrl-C stops the waiting, never the run."""

from __future__ import annotations

import os
import time
from typing import TextIO
from urllib.parse import quote

from nanobotd.cli.invocation import Invocation
from nanobotd.cli.runtext import OPEN_STATES, format_seconds, progress_text

POLL_SECONDS = 0.2  # each poll waits this long in the daemon for the run's end (wait_ms), then asks again
REDRAW_SECONDS = 0.1  # on a terminal, the progress line is redrawn (and the run asked) this often
FALLBACK_WIDTH = 80


class StoppedWaiting(Exception):
    """Ctrl-C while waiting; *run_ids* are the runs still going on in the daemon."""

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__(", ".join(run_ids))
        self.run_ids = run_ids


class ProgressLine:
    """One line rewritten in place on a terminal; silent when the stream is not one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = is_terminal(stream)
        self.shown = False

    def show(self, text: str, tail: str = "") -> None:
        """Replace the line with *text* then *tail*, *text* cut ('~') to the terminal's width so it never wraps;
        never *tail* (the time so far: what tells a waiting user the run is alive)."""
        if not self.enabled:
            return
        room = max(10, _terminal_width(self.stream) - 1) - len(tail)
        if len(text) > room:
            text = text[:max(0, room - 1)] + "~"
        self.stream.write("\r" + text + tail + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Remove the line, so what follows starts on a clean line."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def is_terminal(stream: TextIO) -> bool:
    """Whether *stream* is an interactive terminal (a test's StringIO or a pipe is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def fetch_run(invocation: Invocation, run_id: str, wait: float = 0.0) -> dict:
    """GET /v1/runs/{id}; *wait*: answered once the run has ended, or after that many seconds."""
    return invocation.client.get(f"/v1/runs/{quote(run_id, safe='')}",
                                 {"wait_ms": round(wait * 1000)} if wait > 0 else None)


def wait_for_runs(invocation: Invocation, run_ids: list[str]) -> list[dict]:
    """Each run once it has ended, showing its progress meanwhile; StoppedWaiting on Ctrl-C."""
    line = ProgressLine(invocation.stderr)
    finished: list[dict] = []
    try:
        for run_id in run_ids:
            finished.append(_wait_for_run(invocation, run_id, line))
    except KeyboardInterrupt:
        raise StoppedWaiting(run_ids[len(finished):]) from None
    finally:
        line.clear()
    return finished


def _wait_for_run(invocation: Invocation, run_id: str, line: ProgressLine) -> dict:
    """Ask about the run until it has ended, each answer held back until the end or for one redraw (one poll off
    a terminal), so the end is heard of as it happens."""
    began = time.monotonic()
    offset = None
    wait = REDRAW_SECONDS if line.enabled else POLL_SECONDS
    while True:
        asked = time.monotonic()
        run = fetch_run(invocation, run_id, wait).get("run") or {}
        if run.get("state") not in OPEN_STATES:
            return run
        now = time.monotonic()
        if offset is None:
            offset = float((run.get("progress") or {}).get("elapsed_seconds") or 0.0)
        line.show(f"{run.get('kind', 'run')} {run_id}: {progress_text(run, with_time=False)}",
                  f", {format_seconds(offset + now - began)}")
        # a daemon that answers at once (one that does not wait) is asked no faster than before
        time.sleep(max(0.0, wait - (now - asked)))


def _terminal_width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or FALLBACK_WIDTH
    except (AttributeError, ValueError, OSError):
        return FALLBACK_WIDTH
