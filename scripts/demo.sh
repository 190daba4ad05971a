#!/usr/bin/env bash
# Install nanobotd into .venv and run its main job (consolidation) on a generated demo workspace,
# offline (no API key needed), then show what it did. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' >.venv/install.log 2>&1 \
  || { cat .venv/install.log; exit 1; }

# outside this repository: a workspace inside another git repository gets no git history (by design)
DEMO="${NANOBOTD_DEMO_DIR:-${TMPDIR:-/tmp}/nanobotd-demo}"
rm -rf "$DEMO"
mkdir -p "$DEMO/run" && chmod 700 "$DEMO/run"
.venv/bin/python scripts/make_demo.py "$DEMO" >/dev/null
export XDG_RUNTIME_DIR="$DEMO/run" XDG_STATE_HOME="$DEMO/state" XDG_CONFIG_HOME="$DEMO/config"

.venv/bin/nanobotd run --workspace "$DEMO/workspace" >"$DEMO/nanobotd.log" 2>&1 &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null || true' EXIT
# wait until the daemon answers and its start-up scan of the session folders is done
for _ in $(seq 300); do
  .venv/bin/nanobotctl --json status 2>/dev/null | grep -q '"last_reconcile": "' && break
  sleep 0.1
done

echo "== sessions found in the demo workspace"
.venv/bin/nanobotctl sessions
for key in $(.venv/bin/nanobotctl --json sessions | .venv/bin/python -c 'import json,sys; print(" ".join(s["key"] for s in json.load(sys.stdin)["sessions"]))'); do
  .venv/bin/nanobotctl consolidate "$key" --wait >/dev/null
done
echo
echo "== after consolidation (offline mode archives raw transcripts)"
.venv/bin/nanobotctl status
echo
.venv/bin/nanobotctl runs
echo
echo "== first lines of $DEMO/workspace/memory/history.jsonl"
head -c 700 "$DEMO/workspace/memory/history.jsonl"; echo
echo
echo "Undo any run with: XDG_RUNTIME_DIR=$DEMO/run .venv/bin/nanobotctl restore RUN_ID"
