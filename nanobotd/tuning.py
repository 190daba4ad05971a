"""The tuning constants that still matter, one line each on what the number trades."""

from __future__ import annotations

# --- jobs ---
MAX_WAIT_FACTOR = 5  # changes wait at most this many debounce periods for the index: fewer refreshes vs staleness
TRIM_AFTER_REFRESH_SECONDS = 1.0  # a refresh this long gives its freed memory back (heap.trim): RSS vs a trim's cost
