#!/usr/bin/env bash
# Install nanobotd into .venv and run it offline (no API key needed) on a generated demo workspace: the
# daemon archives the demo sessions, one archive is undone for real with `nanobotctl restore`, and the
# daemon is left running so the commands printed at the end work (with the exact command that stops it).
#
# Each run gets its own folder (mktemp), or $NANOBOTD_DEMO_DIR; two demos can run at the same time.
# NANOBOTD_DEMO_KEEP=0 stops the daemon at the end; NANOBOTD_DEMO_VENV=DIR uses an existing virtualenv
# that already has nanobotd (nothing is installed then).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-python3}
KEEP=${NANOBOTD_DEMO_KEEP:-1}
VENV=${NANOBOTD_DEMO_VENV:-$REPO/.venv}

install_venv() {
  # Two demos started together share .venv: one installs while the other waits.
  if command -v flock >/dev/null; then
    exec 9>"$REPO/.venv.lock"
    flock -n 9 || { echo "waiting for another demo to finish installing into .venv ..."; flock 9; }
  fi
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  if [ ! -e .venv/.demo-installed ] || [ pyproject.toml -nt .venv/.demo-installed ]; then
    # The first install takes a minute or two: say so, and show each package as pip gets to it.
    echo "installing nanobotd and its dependencies into .venv (first run: a minute or two; log: .venv/install.log)"
    if ! .venv/bin/python -m pip install --progress-bar off --disable-pip-version-check -e '.[test]' 2>&1 \
        | tee .venv/install.log \
        | awk '/^(Collecting|Installing collected|Successfully installed)/ { print "  " substr($0, 1, 76); fflush() }'
    then
      echo "pip install failed: see .venv/install.log" >&2
      exit 1
    fi
    touch .venv/.demo-installed
  fi
  if command -v flock >/dev/null; then flock -u 9; fi
}
[ -n "${NANOBOTD_DEMO_VENV:-}" ] || install_venv

if [ -n "${NANOBOTD_DEMO_DIR:-}" ]; then
  DEMO=$NANOBOTD_DEMO_DIR
  # only ever empty a folder an earlier demo made
  if [ -e "$DEMO" ] && [ -n "$(ls -A "$DEMO")" ] && [ ! -e "$DEMO/.nanobotd-demo" ]; then
    echo "demo.sh: $DEMO is not empty and not an earlier demo; choose another NANOBOTD_DEMO_DIR" >&2
    exit 1
  fi
  rm -rf "$DEMO"
  mkdir -p "$DEMO"
else
  # outside this repository: a workspace inside another git repository gets no git history (by design)
  DEMO=$(mktemp -d "${TMPDIR:-/tmp}/nanobotd-demo.XXXXXX")
fi
DEMO=$(cd "$DEMO" && pwd)
touch "$DEMO/.nanobotd-demo"
mkdir -p "$DEMO/run" "$DEMO/config" && chmod 700 "$DEMO/run"
"$VENV/bin/python" scripts/make_demo.py "$DEMO" >/dev/null
CONFIG=$DEMO/config/nanobotd.toml
SOCKET=$DEMO/run/nanobotd.sock
# The demo sessions are written as nanobot 0.3.5 writes them, with its archive mark; mode "auto" would then
# leave the archiving to nanobot. Here nanobotd plays the owner, so that it archives.
cat >"$CONFIG" <<EOF
[daemon]
socket = "$SOCKET"
state_dir = "$DEMO/state"

[[workspaces]]
path = "$DEMO/workspace"
name = "demo"
consolidation = { mode = "owner" }
EOF
CTL=("$VENV/bin/nanobotctl" --config "$CONFIG")

"$VENV/bin/nanobotd" run --config "$CONFIG" >"$DEMO/nanobotd.log" 2>&1 &
DAEMON=$!
stop_daemon() { kill -TERM "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true; }
trap stop_daemon EXIT
# wait until the daemon answers and its start-up scan of the session folder is done
for attempt in $(seq 300); do
  if ! kill -0 "$DAEMON" 2>/dev/null; then
    echo "demo.sh: nanobotd exited at start; its log ($DEMO/nanobotd.log):" >&2
    cat "$DEMO/nanobotd.log" >&2
    exit 1
  fi
  "${CTL[@]}" --json status 2>/dev/null | grep -q '"last_reconcile": "' && break
  if [ "$attempt" = 300 ]; then
    echo "demo.sh: nanobotd does not answer on $SOCKET after 30 s; its log:" >&2
    cat "$DEMO/nanobotd.log" >&2
    exit 1
  fi
  sleep 0.1
done

echo "== demo in $DEMO, nanobotd pid $DAEMON"
echo
echo "== sessions found in the demo workspace (nanobotctl sessions)"
"${CTL[@]}" sessions
echo
echo "== archive each session now (nanobotctl consolidate KEY; offline mode archives raw transcripts)"
KEYS=$("${CTL[@]}" --json sessions | "$VENV/bin/python" -c \
  'import json, sys; print(" ".join(s["key"] for s in json.load(sys.stdin)["sessions"]))')
for key in $KEYS; do
  "${CTL[@]}" consolidate "$key"
done
echo
echo "== the run ledger (nanobotctl runs)"
"${CTL[@]}" runs
FIRST=$("${CTL[@]}" --json runs --kind consolidate | "$VENV/bin/python" -c \
  'import json, sys; print(json.load(sys.stdin)["runs"][-1]["run_id"])')
echo
echo "== first lines of $DEMO/workspace/memory/history.jsonl"
head -c 500 "$DEMO/workspace/memory/history.jsonl"; echo
echo
echo "== undo the first archive: the plan (nanobotctl restore $FIRST --dry-run), then for real"
"${CTL[@]}" restore "$FIRST" --dry-run
"${CTL[@]}" restore "$FIRST"
echo
# the index refreshes a debounce after the last change: wait for it, so the status and the searches suggested below
# show every archived message
for _ in $(seq 1 60); do
  "${CTL[@]}" --json status | "$VENV/bin/python" -c 'import json, sys
search = json.load(sys.stdin)["workspaces"][0]["search"]
sys.exit(0 if search["refreshes"] and not search["pending_changes"] and not search["refreshing"] else 1)' && break
  sleep 0.25
done
echo "== status after the restore (nanobotctl status)"
"${CTL[@]}" status

echo
if [ "$KEEP" = 0 ]; then
  stop_daemon
  echo "nanobotd stopped. Start it again on this demo with:"
  echo "  $VENV/bin/nanobotd run --config $CONFIG &"
  echo "then, for instance: ${CTL[*]} runs"
else
  trap - EXIT
  echo "nanobotd keeps running (pid $DAEMON, log $DEMO/nanobotd.log). Try:"
  echo "  ${CTL[*]} runs"
  echo "  ${CTL[*]} run $FIRST"
  echo "  ${CTL[*]} search kestrel"
  echo "Stop it with: kill $DAEMON"
fi
