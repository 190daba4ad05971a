"""Find where nanobot keeps a workspace's session files (both layouts, NANOBOT-COMPAT.md).

Current nanobot: `<config dir>/sessions/<workspace-id>/`, the id being the 32-hex line in
`<workspace>/.nanobot/workspace-id`; older nanobot: `<workspace>/sessions/`. An explicit
sessions dir in the config wins.
"""

from __future__ import annotations

import re
from pathlib import Path

WORKSPACE_ID_FILE = Path(".nanobot") / "workspace-id"
WORKSPACE_MARKER = ".workspace"
HEX_ID = re.compile(r"^[0-9a-f]{32}$")


def read_workspace_id(workspace: Path) -> str | None:
    """The workspace's 32-hex id, or None when nanobot has not written one (yet)."""
    try:
        text = (workspace / WORKSPACE_ID_FILE).read_text(encoding="utf-8").strip().lower()
    except (OSError, UnicodeDecodeError):
        return None
    return text if HEX_ID.match(text) else None


def candidate_config_dirs(workspace: Path, home: Path | None) -> list[Path]:
    """Where nanobot's config folder may be: the workspace's parent (default layout) and ~/.nanobot."""
    candidates = [workspace.parent]
    if home is not None:
        candidates.append(home / ".nanobot")
    unique = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def discover_sessions_dirs(workspace: Path, explicit: Path | None, home: Path | None) -> list[Path]:
    """Every folder holding this workspace's session files, best first; may be empty (not there yet)."""
    if explicit is not None:
        return [explicit]
    found: list[Path] = []
    workspace_id = read_workspace_id(workspace)
    if workspace_id:
        for config_dir in candidate_config_dirs(workspace, home):
            folder = config_dir / "sessions" / workspace_id
            if folder.is_dir() and _marker_matches(folder, workspace):
                found.append(folder)
                break
    legacy = workspace / "sessions"
    if legacy.is_dir():
        found.append(legacy)
    return found


def _marker_matches(folder: Path, workspace: Path) -> bool:
    """The `.workspace` file names the workspace's absolute path; a missing marker is accepted."""
    try:
        named = (folder / WORKSPACE_MARKER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return True
    if not named:
        return True
    try:
        return Path(named).resolve() == workspace.resolve()
    except OSError:
        return False
