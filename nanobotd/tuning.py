"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

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
