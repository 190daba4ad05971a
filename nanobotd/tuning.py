"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

# --- memory files, state, git, watcher, scheduler, nanobotctl ---
HISTORY_LOCK_SECONDS = 30.0  # wait for history.jsonl's flock before giving up: a stuck holder against a failed job
# after a history rewrite's rename the old file is watched this long past its last byte for an agent's late append
# (nanobot opens, writes one line, closes): longer costs every rewrite that much, shorter risks a line left behind
LATE_APPEND_QUIET_SECONDS = 0.05
LATE_APPEND_POLL_SECONDS = 0.005  # how often the old file is read meanwhile: CPU against the quiet period's accuracy
FILE_LOCK_POLL_SECONDS = 0.02  # a busy flock is tried again this often until its timeout: CPU against waiting longer
MAX_DEBOUNCE_FACTOR = 5  # a session saved again and again is scanned at the latest after this many debounce periods
CATCH_UP_DAYS = 8  # a nightly run missed within this many days runs once at start: older ones are let go
CLOCK_JUMP_SECONDS = 30.0  # wall against monotonic clock drift between two ticks taken as a jump (step, suspend)
HOLDER_READ_TRIES = 20  # a lock's new holder writes its pid right after taking it: reads of it before giving up
HOLDER_READ_PAUSE = 0.05  # between those reads: a second daemon's exit delay against naming the first
GIT_TIMEOUT_SECONDS = 60  # a git call still running after this is killed: a hung git against a large repository
GIT_LOCK_RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)  # waits on a busy index.lock: a delay against failing
GIT_STALE_LOCK_SECONDS = 600  # an index.lock older than this is a dead git's and removed: never a live one's
# the state DB connection's page cache: a long session's archive marks go into the archived index in digest order and
# evicted pages were read back over and over with SQLite's 2 MiB; filled only as pages are touched, given back idle
STATE_CACHE_KIB = 8 * 1024
# --- search ---
WINDOW = 800  # a session window holds messages until their lines reach this many characters: context vs focus
STRIDE = 400  # a new session window starts every this many characters: recall at window edges vs units indexed
MAX_MESSAGES = 24  # at most this many messages a window (tiny or tool-only lines): bounds a window's memory
LINE_OVERHEAD = 80  # bytes of JSON around a message's text on its line, not counted toward its window
PART_WEIGHT = 0.5  # the best message or line of a unit against the whole unit: one turn answering vs spread words
COVERAGE_SHARE = 0.5  # share of a hit's score that is how much of the query it holds: all words vs the rarest one
QUESTION_WEIGHT = 0.5  # a question's matches count this much: its answer ranks above it (a failed lookup's echo)
SESSION_PRIOR = 0.9  # a raw turn's score against curated memory at equal match: the curated one first
HIT_WORDS = 100  # words a hit shows on average (ten in 1,000): the agent reads them all vs context around a match
MIN_HIT_WORDS = 60  # words left for each hit still to come: late hits kept readable vs the first ones' room
CANDIDATES_PER_HIT = 4  # candidates fetched per hit asked for (trimmed overlaps drop some): recall vs time
MIN_CANDIDATES = 40  # candidates fetched at least: recall vs time
MATCH_BUDGET = 1_000  # postings a query's clauses may match before the commonest are dropped: p95 vs recall
MAX_UNIT_CHARS = 1_500  # a markdown section is cut into pieces of this size: focus vs context
HISTORY_UNIT_CHARS = 300  # a history entry is cut into pieces of 2-4 fact lines: words shown per fact found
# --- api ---
MAX_BODY_BYTES = 1024 * 1024  # a request body past this is refused (413) before it is read: memory per request
MAX_HEAD_BYTES = 64 * 1024  # request line + headers past this are refused (431): memory per half-read request
READ_TIMEOUT_SECONDS = 10.0  # a request not received whole by then gets 408: how long a stalled client holds a socket
STOP_GRACE_SECONDS = 2.0  # open requests get this long at stop before they are cancelled: a slower stop
BACKLOG = 1024  # connections the kernel queues before accept (capped at somaxconn): clients that come all at once
MAX_RUN_WAIT_MS = 10_000  # GET /v1/runs/{id}?wait_ms= waits at most this long: one held connection per waiting client
# --- llm ---
LLM_START_TIMEOUT_SECONDS = 60.0  # a worker child not ready by then (importing litellm) is killed: slow start vs stuck
LLM_HANG_GRACE_SECONDS = 1.0  # past a call's timeout before the daemon kills a silent child: false kills vs time stuck
LLM_EXIT_WAIT_SECONDS = 5.0  # a child whose output ended gets this long to exit before SIGKILL: clean exit vs wait
LLM_CLOSE_WAIT_SECONDS = 5.0  # a closed worker's child gets this long to drain and exit before SIGKILL: stop time
LLM_BACKOFF_BASE_SECONDS = 0.5  # first retry waits about this long, doubling: load on a struggling server vs delay
LLM_BACKOFF_CAP_SECONDS = 8.0  # the longest backoff between retries: the same trade, bounded
LLM_RETRY_AFTER_CAP_SECONDS = 30.0  # a server's Retry-After is honoured up to this: a job held that long at most
LLM_BAD_RESPONSE_RETRIES = 1  # a garbled body is retried this often (a proxy hiccup) before the server is blamed
LLM_REQUEST_LINE_BYTES = 256 * 1024 * 1024  # the longest request line the child reads: a whole prompt, memory per line
# --- jobs ---
MAX_WAIT_FACTOR = 5  # changes wait at most this many debounce periods for the index: fewer refreshes vs staleness
TRIM_AFTER_REFRESH_SECONDS = 1.0  # a refresh this long gives its freed memory back (heap.trim): RSS vs a trim's cost
JOBS_PER_LLM_SLOT = 2  # LLM jobs let run per llm.concurrency slot: slots kept busy through a burst vs jobs in memory
FAILURE_RETRY_SECONDS = 1.0  # a failed run whose end cannot be written (a full disk) is tried again after this, then
MAX_FAILURE_RETRY_SECONDS = 60.0  # twice as long each time up to this: shown running for longer vs writes tried in vain
SAFETY_MARGIN = 1.2  # a chunk's planned tokens are this much under its share of the window: fit vs fewer requests
PROMPT_OVERHEAD_TOKENS = 600  # the archive prompt's own tokens, kept free in a chunk's request
PLAN_PAGE = 1024  # plan messages a budget run reads at a time: fewer queries vs reading what it never archives
MARK_BATCH_CHUNKS = 64  # archive marks committed together, up to this many chunks: fewer commits vs work redone
MARK_BATCH_SECONDS = 2.0  # ... or this long after the first: how long archived messages wait for their mark
APPEND_GROUP_CHUNKS = 8  # raw chunks read ahead and appended at once (one lock, one fsync): speed vs memory held
APPEND_GROUP_TOKENS = 800_000  # ... up to this many tokens (~3-4 bytes each, held two or three times over)
INPUT_SHARE = 0.4  # of the context window, what a flush, dream batch or note summary sends: input vs reply room
CHARS_PER_TOKEN = 4  # the estimate where a count would not change the decision (a cut, a batch's size)
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
MESSAGE_BLOCK = 256  # messages stored in one row of the message cache: rows written at a first start against the
# block an append rewrites
ROWS_BLOCK = 4096  # messages whose columns become strings together: speed of long reads against a block's memory
HASH_BLOCK = 1 << 20  # bytes hashed a read at a time when a scan checks the known region
READ_CHUNK = 1 << 20  # bytes a scan reads at a time: fewer reads against a chunk's memory
SEARCHED_LOOKUPS = 64  # an append's digests searched in the known column before they make a set (a set costs memory)
SPOOL_BATCH = 1000  # spool rows written, moved or read together: fewer statements against rows held in memory
DIGEST_LOOKUP = 500  # digests looked up in one query (SQLite's bound-parameter limit is far above)
ROWS_PER_STATEMENT = 500  # rows in one JSON array statement: a long session's rows are never one huge string
HOLD_MIN_BYTES = 64 << 10  # a scan's new rows this long (and most of the file) are held in a copy of it, not
# spooled as text: a copy and its sync against their text written to the state database
HELD_READ_SPAN = 4 << 20  # held lines next to each other read with one read of up to this many bytes
HELD_READ_GAP = 64 << 10  # ... with at most this many bytes between two of them (fewer reads against wasted bytes)
STREAM_BLOCK = 1 << 20  # a copy the kernel will not make between two filesystems is streamed in blocks this long
RESCUE_MEMORY_SECONDS = 3600.0  # how long a rescue is remembered, to count a late agent entry as archived twice
SCAN_SLICE_SECONDS = 0.25  # a reconcile holds the tracker's lock this long at a time: archive marks wait for it
WAL_LIMIT_BYTES = 16 << 20  # the state database's log is cut back to this size once checkpointed: disk against regrowth
