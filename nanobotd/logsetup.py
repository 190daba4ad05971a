"""Logging: loguru to stderr, stdlib logging routed into it, secrets masked in the final text (tracebacks and
libraries' records too). Under systemd each line carries an sd-daemon `<N>` priority and no timestamp."""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Callable
from typing import TextIO

from loguru import logger

MASK = "***"
MIN_SECRET_CHARS = 6
NOISY_LOGGERS = ("apscheduler", "watchdog", "litellm", "LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx",
                 "httpcore", "openai", "urllib3", "git", "asyncio")
TERMINAL_FORMAT = "{time:YYYY-MM-DD HH:mm:ss.SSS} {level:<8} {name}: {message}"
JOURNAL_FORMAT = "{name}: {message}"
# sd-daemon(3) priorities by loguru level number: critical, error, warning, notice (SUCCESS), info, debug.
SYSLOG_PRIORITIES = ((50, 2), (40, 3), (30, 4), (25, 5), (20, 6))
DEBUG_PRIORITY = 7


class InterceptHandler(logging.Handler):
    """Hands stdlib logging records to loguru, keeping the caller's module, level and exception."""

    def emit(self, record: logging.LogRecord) -> None:
        """Re-log *record* through loguru from the frame that called the stdlib logger."""
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        frame, depth = inspect.currentframe(), 0
        while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame = frame.f_back
            depth += 1
        logger.opt(depth=depth, exception=record.exc_info).log(level, record.getMessage())


def configure_logging(level: str, *, under_systemd: bool, secrets: list[str], stream: TextIO | None = None) -> None:
    """Send all logging to *stream* (stderr) at *level*, formatted for journald or a terminal, secrets masked."""
    stream = sys.stderr if stream is None else stream
    redact = secret_redactor(secrets)
    logger.remove()
    logger.add(_sink(stream, redact, journal=under_systemd),
               level=level.upper(), format=JOURNAL_FORMAT if under_systemd else TERMINAL_FORMAT,
               colorize=False, backtrace=False, diagnose=False)
    logging.basicConfig(handlers=[InterceptHandler()], level=0, force=True)
    capture_library_loggers()


def capture_library_loggers(names: tuple[str, ...] = NOISY_LOGGERS) -> None:
    """Quiet chatty libraries to WARNING and drop handlers they attached (litellm does, on import: call this
    again after such a lazy import), so their records reach us."""
    for name in names:
        library_logger = logging.getLogger(name)
        library_logger.setLevel(logging.WARNING)
        for handler in list(library_logger.handlers):
            library_logger.removeHandler(handler)
        library_logger.propagate = True


def secret_redactor(secrets: list[str]) -> Callable[[str], str]:
    """A function masking every secret of at least MIN_SECRET_CHARS characters (longest first)."""
    usable = sorted({secret for secret in secrets if secret and len(secret) >= MIN_SECRET_CHARS}, key=len,
                    reverse=True)
    if not usable:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(secret) for secret in usable))
    return lambda text: pattern.sub(MASK, text)


def syslog_priority(level_number: int) -> int:
    """The sd-daemon `<N>` priority for a loguru level number."""
    return next((priority for threshold, priority in SYSLOG_PRIORITIES if level_number >= threshold), DEBUG_PRIORITY)


def _sink(stream: TextIO, redact: Callable[[str], str], *, journal: bool) -> Callable:
    def write(message) -> None:
        text = redact(str(message))
        if journal:  # journald reads line by line: each traceback line needs the priority too
            prefix = f"<{syslog_priority(message.record['level'].no)}>"
            text = "".join(f"{prefix}{line}\n" for line in text.splitlines())
        stream.write(text)
        stream.flush()

    return write
