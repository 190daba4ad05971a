"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

# --- memory files, state, git, watcher, scheduler, nanobotctl ---
HISTORY_LOCK_SECONDS = 30.0  # wait for history.jsonl's flock before giving up: a stuck holder against a failed job
# after a history rewrite's rename the old file is watched this long past its last byte for an agent's late append
# (nanobot opens, writes one line, closes): longer costs every rewrite that much, shorter risks a line left behind
LATE_APPEND_QUIET_SECONDS = 0.05
LATE_APPEND_POLL_SECONDS = 0.005  # how often the old file is read meanwhile: CPU against the quiet period's accuracy
