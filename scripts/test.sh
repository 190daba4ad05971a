#!/usr/bin/env bash
# Install nanobotd with its test dependencies and QMD, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' >.venv/install.log 2>&1 \
  || { cat .venv/install.log; exit 1; }
bash scripts/install-qmd.sh >/dev/null || echo "QMD could not be installed; its tests will skip" >&2
exec .venv/bin/python -m pytest -q "$@"
