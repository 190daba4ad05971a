"""nanobotd/heap.py: freed memory really goes back to the system, and a system without glibc is no error."""

from __future__ import annotations

import subprocess
import sys

from nanobotd import heap

# In a child process: fill ~80 MB of glibc heap with 1 kB objects (pymalloc takes only those of 512 bytes or
# less), free all but the last (it pins the top of the heap, so free() alone cannot shrink it), then trim.
CHILD = """
import sys
from nanobotd import heap

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

blocks = [bytes(1000) + i.to_bytes(8, "little") for i in range(80_000)]
pinned = blocks[-1]
del blocks
before = rss_mb()
trimmed = heap.trim()
print(trimmed, round(before, 1), round(rss_mb(), 1))
"""


def test_trim_hands_freed_heap_pages_back_to_the_system():
    answer = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    trimmed, before, after = answer.stdout.split()
    assert trimmed == "True"
    assert float(before) - float(after) > 50  # most of the ~80 MB freed but kept, now given back


def test_a_system_without_malloc_trim_is_told_apart_not_an_error():
    assert heap.trim("libnanobotd-no-such-library.so.9") is False
