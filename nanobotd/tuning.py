"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

# --- sessions and tokens ---
# UTF-8 bytes a token, for the estimate a scan stores: lower estimates more tokens (prose runs more bytes a token
# than tool output and JSON); the band below keeps decisions exact whatever the text
ESTIMATE_BYTES_PER_TOKEN = 3
# an estimated tail within [LOW, HIGH] x a threshold is counted exactly before deciding: a wider band counts more
# sessions (loading an encoding, tens of MB, while it is used); a narrower one lets odd text (base64, CJK) misjudge
EXACT_BAND_LOW = 0.5
EXACT_BAND_HIGH = 2.0
MAX_COUNTED_CHARS = 4_000_000  # text past this is estimated even when counted: caps the cost of one huge message
TOKENIZER_IDLE_SECONDS = 60.0  # an encoding unused this long is let go (its memory back) and loaded again on demand
CACHED_MESSAGES = 50_000  # message caches kept in memory for the sessions used last: memory against re-reads
CACHE_IDLE_SECONDS = 300.0  # a session's caches go after this long unused: memory against reading them back
ROWS_BLOCK = 4096  # messages whose columns become strings together: speed of long reads against a block's memory
HASH_BLOCK = 1 << 20  # bytes hashed a read at a time when a scan checks the known region
READ_CHUNK = 1 << 20  # bytes a scan reads at a time: fewer reads against a chunk's memory
SEARCHED_LOOKUPS = 64  # an append's digests searched in the known column before they make a set (a set costs memory)
SPOOL_BATCH = 1000  # spool rows written, moved or read together: fewer statements against rows held in memory
DIGEST_LOOKUP = 500  # digests looked up in one query (SQLite's bound-parameter limit is far above)
ROWS_PER_STATEMENT = 500  # rows in one JSON array statement: a long session's rows are never one huge string
HELD_READ_SPAN = 4 << 20  # held lines next to each other read with one read of up to this many bytes
HELD_READ_GAP = 64 << 10  # ... with at most this many bytes between two of them (fewer reads against wasted bytes)
STREAM_BLOCK = 1 << 20  # a copy the kernel will not make between two filesystems is streamed in blocks this long
RESCUE_MEMORY_SECONDS = 3600.0  # how long a rescue is remembered, to count a late agent entry as archived twice
SCAN_SLICE_SECONDS = 0.25  # a reconcile holds the tracker's lock this long at a time: archive marks wait for it
WAL_LIMIT_BYTES = 16 << 20  # the state database's log is cut back to this size once checkpointed: disk against regrowth
