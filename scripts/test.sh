#!/usr/bin/env bash
# Install nanobotd with its test dependencies, QMD and (for compatibility tests) nanobot-ai in its own venv;
# check the layer contracts and the linter; then run the whole test suite.
# Disk: .venv about 400 MB; chromium about 300 MB (apt, as root); QMD and its Node 22 in .qmd-prefix/ about 1.1 GB (skipped without npm: its
# tests skip); nanobot-ai in the user's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' >.venv/install.log 2>&1 \
  || { cat .venv/install.log; exit 1; }
# bytecode, as an installed nanobotd has it: the daemons and nanobotctl the tests start read it instead of compiling
# every module each time (where PYTHONDONTWRITEBYTECODE is set, nothing else would write it)
.venv/bin/python -m compileall -q nanobotd >/dev/null
bash scripts/install-qmd.sh >/dev/null || echo "QMD could not be installed; its tests will skip" >&2
bash scripts/install-nanobot.sh >/dev/null || echo "nanobot-ai could not be installed; its tests will skip" >&2
# the web page's end-to-end tests drive Debian's headless chromium through its chromedriver
if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
    >/dev/null 2>&1 || echo "chromium could not be installed; the web page's browser tests will skip" >&2
fi
# the layer contracts (pyproject [tool.importlinter]) and the linter hold before any test runs
.venv/bin/lint-imports --no-cache >/dev/null || { .venv/bin/lint-imports --no-cache; exit 1; }
.venv/bin/ruff check -q nanobotd tests scripts
# three workers on two cores (most e2e tests wait on a daemon, not the CPU), one test file each at a time (tests
# in a file share fixtures and daemons); `-n 0` runs sequentially
exec .venv/bin/python -m pytest -q -n 3 --dist loadfile "$@"
