"""Who is on the other end of a Unix socket, as the kernel saw it (SO_PEERCRED).

The credentials are those of the process at connect() time (for a server: at listen() time), so a
peer cannot fake them and they also name the pid of a daemon already listening on a socket.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class PeerCredentials:
    """pid, uid and gid of the peer process."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: Any) -> PeerCredentials | None:
    """The peer's credentials, or None when the socket cannot tell (not AF_UNIX, already closed)."""
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    except (OSError, AttributeError):
        return None
    if len(raw) != UCRED.size:
        return None
    pid, uid, gid = UCRED.unpack(raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def peer_groups(pid: int) -> set[int]:
    """The peer process's primary and supplementary group ids (from /proc); empty when it cannot be read.

    SO_PEERCRED names only the primary gid, so a peer allowed through a supplementary group is found here.
    """
    groups: set[int] = set()
    try:
        with open(f"/proc/{int(pid)}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name == "Groups":
                    groups.update(int(item) for item in value.split() if item.isdigit())
                elif name == "Gid":
                    groups.update(int(item) for item in value.split()[:1] if item.isdigit())
    except (OSError, ValueError):
        return set()
    return groups
