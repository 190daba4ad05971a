#!/usr/bin/env bash
# Install the real nanobot agent (nanobot-ai from PyPI) into a venv of its own, then print its python.
#
# nanobot is never a dependency of nanobotd: it only drives compatibility runs (scripts/nanobot_day.py,
# the streaming tests) against the fake LLM. Its venv lives in the user's cache, outside the repository.
# A second run with the same version is a quick no-op (a stamp file records what was installed).
#
# Environment: NANOBOT_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/nanobotd/nanobot-ai-<version>),
# NANOBOT_VERSION (0.3.5), PYTHON (python3; nanobot-ai needs >= 3.11).
# stdout: the venv's python path, and nothing else. Logs go to stderr.
set -euo pipefail

VERSION="${NANOBOT_VERSION:-0.3.5}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}"
VENV="${NANOBOT_VENV:-$CACHE_ROOT/nanobotd/nanobot-ai-$VERSION}"
BASE_PYTHON="${PYTHON:-python3}"
VENV_PYTHON="$VENV/bin/python"
STAMP="$VENV/.nanobotd-installed"
STAMP_TEXT="nanobot-ai==$VERSION"

log() { printf 'install-nanobot: %s\n' "$*" >&2; }

installed() {
    [[ -x "$VENV_PYTHON" ]] && [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$STAMP_TEXT" ]] \
        && [[ -x "$VENV/bin/nanobot" ]]
}

if installed; then
    printf '%s\n' "$VENV_PYTHON"
    exit 0
fi

command -v "$BASE_PYTHON" >/dev/null || { log "$BASE_PYTHON not found (set PYTHON)"; exit 1; }
"$BASE_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { log "nanobot-ai needs Python >= 3.11; $BASE_PYTHON is $("$BASE_PYTHON" -V 2>&1)"; exit 1; }

rm -f "$STAMP"
if [[ ! -x "$VENV_PYTHON" ]]; then
    log "creating venv $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$BASE_PYTHON" -m venv "$VENV" >&2
fi

log "installing nanobot-ai==$VERSION into $VENV"
"$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check "nanobot-ai==$VERSION" >&2

actual="$("$VENV_PYTHON" -c 'from importlib.metadata import version; print(version("nanobot-ai"))')"
if [[ "$actual" != "$VERSION" ]]; then
    log "pip installed nanobot-ai $actual, wanted $VERSION"
    exit 1
fi
"$VENV/bin/nanobot" --help >/dev/null 2>&1 || { log "the nanobot command does not start"; exit 1; }

printf '%s\n' "$STAMP_TEXT" >"$STAMP"
log "ready: nanobot-ai $actual"
printf '%s\n' "$VENV_PYTHON"
