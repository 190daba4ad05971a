"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

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
