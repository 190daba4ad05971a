"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

# --- sessions and tokens ---
# UTF-8 bytes a token, for the estimate a scan stores: lower estimates more tokens (English prose runs ~4.4 bytes a
# token, tool output and JSON ~2.6); the band below keeps decisions exact whatever the text
ESTIMATE_BYTES_PER_TOKEN = 3
# an estimated tail within [LOW, HIGH] x a threshold is counted exactly before deciding: a wider band counts more
# sessions (loading an encoding, ~70 MB, while it is used); a narrower one lets odd text (base64, CJK) misjudge
EXACT_BAND_LOW = 0.5
EXACT_BAND_HIGH = 2.0
MAX_COUNTED_CHARS = 4_000_000  # text past this is estimated even when counted: caps the cost of one huge message
TOKENIZER_IDLE_SECONDS = 60.0  # an encoding unused this long is let go (its memory back) and loaded again on demand
CACHED_MESSAGES = 50_000  # message caches kept in memory for the sessions used last: memory against re-reads
SCAN_SLICE_SECONDS = 0.25  # a reconcile holds the tracker's lock this long at a time: archive marks wait for it
