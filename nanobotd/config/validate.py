"""Value checks the types alone do not make, each a ConfigError naming its key so `nanobotd` exits 2 at once
(a NaN debounce or a state_dir that is a file would otherwise fail long after start)."""

from __future__ import annotations

import math
from pathlib import Path


class ConfigError(ValueError):
    """The config is unusable; the message names the offending key."""


def check_number(value: float, key: str, bounds: tuple[float, bool, float] | None) -> None:
    """A finite number inside its field's *bounds* (lowest, whether it is allowed, highest)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")
    if bounds is None:
        return
    low, low_allowed, high = bounds
    if value < low or (value == low and not low_allowed) or value > high:
        lowest = f"at least {low:g}" if low_allowed else f"more than {low:g}"
        raise ConfigError(f"{key}: must be {lowest} and at most {high:g}, got {value}")


def check_choice(value: str, key: str, choices: tuple[str, ...]) -> str:
    """*value* as the one of *choices* it names, whatever its case."""
    match = next((name for name in choices if name.casefold() == value.casefold()), None)
    if match is None:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
    return match


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
