"""Tuning constants that still matter, each with a line on what it trades (grouped by area)."""

# --- api ---
MAX_BODY_BYTES = 1024 * 1024  # a request body past this is refused (413) before it is read: memory per request
MAX_HEAD_BYTES = 64 * 1024  # request line + headers past this are refused (431): memory per half-read request
READ_TIMEOUT_SECONDS = 10.0  # a request not received whole by then gets 408: how long a stalled client holds a socket
STOP_GRACE_SECONDS = 2.0  # open requests get this long at stop before they are cancelled: a slower stop
BACKLOG = 1024  # connections the kernel queues before accept (capped at somaxconn): clients that come all at once
MAX_RUN_WAIT_MS = 10_000  # GET /v1/runs/{id}?wait_ms= waits at most this long: one held connection per waiting client
