"""Value checks the types alone do not make, each a ConfigError naming its key so `nanobotd` exits 2 at once
(a NaN debounce or a state_dir that is a file would otherwise fail long after start)."""

from __future__ import annotations

import math
from pathlib import Path

DAY = 86400.0
# key -> (lowest, whether the lowest itself is allowed, highest): the values a running daemon can live with.
NUMBER_BOUNDS: dict[str, tuple[float, bool, float]] = {
    "daemon.reconcile_seconds": (1, True, DAY),
    "daemon.debounce_seconds": (0, False, 3600),
    "daemon.job_stop_seconds": (0, False, 3600),
    "daemon.parse_processes": (0, True, 16),
    "llm.timeout_seconds": (0, False, 3600),
    "llm.max_retries": (0, True, 20),
    "llm.concurrency": (1, True, 64),
    "llm.context_window": (1, True, 100_000_000),
    "llm.max_tokens": (1, True, 100_000_000),
    "llm.idle_exit_seconds": (1, True, DAY),
    "consolidation.idle_minutes": (0, False, 365 * 24 * 60),
    "consolidation.reserve_floor": (0, True, 100_000_000),
    "consolidation.soft_threshold": (0, True, 100_000_000),
    "consolidation.max_rounds": (1, True, 1000),
    "consolidation.chunk_ratio_max": (0, False, 1),
    "consolidation.chunk_ratio_min": (0, False, 1),
    "consolidation.summary_max_chars": (100, True, 64_000),
    "consolidation.raw_max_chars": (1000, True, 64_000),
    "consolidation.agent_grace_seconds": (0, True, DAY),
    "consolidation.agent_base_tokens": (0, True, 100_000_000),
    "consolidation.flush_idle_margin_seconds": (0, True, DAY),
    "dream.max_iterations": (1, True, 1000),
    "dream.batch_entries": (1, True, 10_000),
    "dream.token_budget": (1, True, 1_000_000_000),
    "lifecycle.active_days": (0, True, 36_500),
    "lifecycle.ttl_days": (0, True, 36_500),
    "lifecycle.max_history_entries": (1, True, 100_000_000),
    "lifecycle.restore_window_days": (0, True, 36_500),
    "search.qmd_timeout_seconds": (0, False, 3600),
    "search.debounce_seconds": (0, False, 3600),
    "context.max_chars": (1, True, 10_000_000),
    "context.total_max_chars": (1, True, 10_000_000),
    "context.budget_tokens": (1, True, 10_000_000),
}


class ConfigError(ValueError):
    """The config is unusable; the message names the offending key."""


def check_number(value: float, key: str, generic_key: str) -> None:
    """A finite number inside the bounds of *generic_key* (`table.name`); *key* is how the user wrote it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")
    bounds = NUMBER_BOUNDS.get(generic_key)
    if bounds is None:
        return
    low, low_allowed, high = bounds
    if value < low or (value == low and not low_allowed) or value > high:
        lowest = f"at least {low:g}" if low_allowed else f"more than {low:g}"
        raise ConfigError(f"{key}: must be {lowest} and at most {high:g}, got {value}")


def check_text(value: str, key: str) -> str:
    """A string that can become a path or a command: no NUL byte (the OS would refuse it much later)."""
    if "\x00" in value:
        raise ConfigError(f"{key}: contains a NUL character")
    return value


def check_directory_path(path: Path, key: str) -> Path:
    """A folder nanobotd creates or uses: it, and every existing folder above it, must be a folder."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            if not candidate.is_dir():
                what = "it" if candidate == path else str(candidate)
                raise ConfigError(f"{key}: {path} cannot be a folder: {what} is a file, not a folder")
            break
    return path


def resolve_path(value: str, key: str, base: Path | None) -> Path:
    """`~` expanded, then a relative path taken from *base* (the config file's folder), else the current one."""
    path = Path(check_text(value, key)).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return Path(*path.parts)  # normalised without resolving symlinks
