"""Giving freed memory back to the operating system: CPython frees into glibc's heap, which keeps the pages, so after a
large transient (an encoding, a long transcript's refresh) RSS stays high; `malloc_trim` hands the free pages back."""

from __future__ import annotations

import ctypes

LIBC = "libc.so.6"


def trim(library: str = LIBC) -> bool:
    """Return the heap's free pages to the system (glibc's malloc_trim); False where that is not available."""
    try:
        release = ctypes.CDLL(library).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    release(0)
    return True
