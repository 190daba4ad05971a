"""systemd service notifications (sd_notify) over sdnotify: no-ops without a NOTIFY_SOCKET in the environment
passed in, so the daemon runs the same in a terminal."""

from __future__ import annotations

import os
import socket
import time
import unicodedata
from collections.abc import Mapping

from loguru import logger
from sdnotify import SystemdNotifier

MAX_STATUS_CHARS = 200


class _AddressedNotifier(SystemdNotifier):
    """sdnotify's sender, connected to the address we were given instead of the one in os.environ."""

    def __init__(self, address: str) -> None:
        self.debug = False
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.socket.connect("\0" + address[1:] if address.startswith("@") else address)
        except OSError:
            self.socket.close()
            raise


class Notifier:
    """Sends READY/WATCHDOG/STATUS/RELOADING/STOPPING to systemd when NOTIFY_SOCKET is set."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._sender: SystemdNotifier | None = None
        address = environ.get("NOTIFY_SOCKET", "")
        if not address:
            return
        try:
            self._sender = _AddressedNotifier(address)
        except OSError as exc:
            logger.warning("cannot reach the systemd notify socket {}: {}", address, exc)

    @property
    def active(self) -> bool:
        """Whether notifications go anywhere."""
        return self._sender is not None

    def ready(self, status: str | None = None) -> None:
        """Startup (or a reload) is complete: the control socket listens."""
        self._send("READY=1" + (f"\nSTATUS={clean_status(status)}" if status else ""))

    def watchdog(self) -> None:
        """Keep-alive; sent only while the daemon's loop and workers are healthy."""
        self._send("WATCHDOG=1")

    def status(self, text: str) -> None:
        """A one-line status for `systemctl status`, made ASCII (sdnotify drops anything else)."""
        self._send(f"STATUS={clean_status(text)}")

    def reloading(self) -> None:
        """A config reload started; send ready() when it is done."""
        self._send(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        """Shutdown started."""
        self._send("STOPPING=1")

    def _send(self, message: str) -> None:
        if self._sender is not None:
            self._sender.notify(message)


def clean_status(text: str) -> str:
    """*text* as one printable ASCII line of at most MAX_STATUS_CHARS: accents dropped, the rest '?'."""
    decomposed = unicodedata.normalize("NFKD", text)
    without_marks = "".join(char for char in decomposed if not unicodedata.combining(char))
    line = " ".join(without_marks.split())
    ascii_line = "".join(char if " " <= char <= "~" else "?" for char in line)
    return ascii_line[:MAX_STATUS_CHARS]


def watchdog_interval(environ: Mapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when no watchdog is meant for us."""
    raw_usec = environ.get("WATCHDOG_USEC", "")
    if not raw_usec.isdigit() or int(raw_usec) <= 0:
        return None
    watchdog_pid = environ.get("WATCHDOG_PID", "")
    if watchdog_pid and watchdog_pid != str(os.getpid() if pid is None else pid):
        return None
    return int(raw_usec) / 2 / 1_000_000
