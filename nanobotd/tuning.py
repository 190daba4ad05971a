"""The tuning constants that still matter, one line each on what the number trades."""

from __future__ import annotations

# --- jobs ---
MAX_WAIT_FACTOR = 5  # changes wait at most this many debounce periods for the index: fewer refreshes vs staleness
TRIM_AFTER_REFRESH_SECONDS = 1.0  # a refresh this long gives its freed memory back (heap.trim): RSS vs a trim's cost
JOBS_PER_LLM_SLOT = 2  # LLM jobs let run per llm.concurrency slot: slots kept busy through a burst vs jobs in memory
SAFETY_MARGIN = 1.2  # a chunk's planned tokens are this much under its share of the window: fit vs fewer requests
PROMPT_OVERHEAD_TOKENS = 600  # the archive prompt's own tokens, kept free in a chunk's request
PLAN_PAGE = 1024  # plan messages a budget run reads at a time: fewer queries vs reading what it never archives
MARK_BATCH_CHUNKS = 16  # archive marks committed together, up to this many chunks: fewer commits vs work redone
MARK_BATCH_SECONDS = 0.5  # ... or this long after the first: how long archived messages wait for their mark
APPEND_GROUP_CHUNKS = 8  # raw chunks read ahead and appended at once (one lock, one fsync): speed vs memory held
APPEND_GROUP_TOKENS = 400_000  # ... up to this many tokens (~4 bytes each, held two or three times over)
INPUT_SHARE = 0.4  # of the context window, what a flush, dream batch or note summary sends: input vs reply room
CHARS_PER_TOKEN = 4  # the estimate where a count would not change the decision (a cut, a batch's size)
