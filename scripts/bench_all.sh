#!/usr/bin/env bash
# Every benchmark, N runs each, each run's JSON saved, then one table of every figure against its goal.
#
#   scripts/bench_all.sh [--quick] [--runs N] [--out DIR] [--tree PATH] [--label NAME] [--only LIST] [sizes]
#
# Benchmarks (LIST is a comma-separated choice of these; default all):
#   consolidate  scripts/bench_consolidate.py: offline consolidation of one big session (and, where the tree's
#                script has them, the same through a real daemon, and saves of it that are not appends)
#   burst        scripts/bench_burst.py --runs 1: sessions crossing the budget at once against the fake LLM
#   search       scripts/bench_search.py: builtin search latency at 100k history entries / 1,000 sessions
#   tracker      scripts/bench_tracker.py: idle cost, change latency, incremental scans, reconcile and cold
#                start (scripts/bench_startup.py), and RSS after the last LLM call (scripts/bench_llm_idle.py)
#
# Sizes (flag, or the environment variable in brackets; default, then the --quick default):
#   --offline-messages N   [BENCH_OFFLINE_MESSAGES]  consolidate: messages of the big session (100000; 10000)
#   --burst-sessions N     [BENCH_BURST_SESSIONS]    burst: sessions written at once (50; 10)
#   --search-history N     [BENCH_SEARCH_HISTORY]    search: history entries (100000; 10000)
#   --search-sessions N    [BENCH_SEARCH_SESSIONS]   search: session files (1000; 100)
#   --startup-sessions N   [BENCH_STARTUP_SESSIONS]  tracker: sessions of the cold start (1000; 100)
#   --startup-messages N   [BENCH_STARTUP_MESSAGES]  tracker: messages per session there (200; 50)
#   --llm-idle-seconds S   [BENCH_LLM_IDLE_SECONDS]  tracker: RSS read this long after the last LLM call (300; 30)
#   --idle-seconds S       [BENCH_IDLE_SECONDS]      tracker: idle CPU window (120; 10)
# Other settings:
#   --runs N               [BENCH_RUNS]   runs of each benchmark (3; --quick 1)
#   --out DIR              [BENCH_OUT]    results folder (default ${TMPDIR:-/tmp}/nanobotd-bench); this run's
#                                         files go to DIR/LABEL/: <bench>-<n>.json, <bench>-<n>.log, table.json
#   --tree PATH            [BENCH_TREE]   checkout of nanobotd to measure: its scripts/ run with PYTHONPATH=PATH
#                                         (default: the checkout this script is in)
#   --label NAME           [BENCH_LABEL]  name of this set of runs (default: the tree's folder name and commit)
#   --quick                               small sizes and one run: a smoke run of a few minutes
#   PYTHON (environment only)             the interpreter (default: the active virtualenv's, else the
#                                         tree's .venv, else python3); it needs nanobotd's dependencies
#
# Compare two trees (before/after):
#   scripts/bench_all.sh --tree /path/to/before --label before --out /tmp/bench
#   scripts/bench_all.sh --label after --out /tmp/bench
#   python3 scripts/bench_table.py --compare /tmp/bench/before/table.json /tmp/bench/after/table.json
#
# The tree's bytecode is compiled first (python -m compileall), as pip compiles an installed nanobotd's.
# A benchmark that fails is noted and the others go on; its figures show as "missing" in the table.
# The machine's load when each run starts is written to DIR/LABEL/load.txt: timings on a shared machine are noisy.
set -u

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-}"
usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }

quick=0
runs="${BENCH_RUNS:-}"
out="${BENCH_OUT:-${TMPDIR:-/tmp}/nanobotd-bench}"
tree="${BENCH_TREE:-$(dirname "$HERE")}"
label="${BENCH_LABEL:-}"
only="${BENCH_ONLY:-consolidate,burst,search,tracker}"
offline_messages="${BENCH_OFFLINE_MESSAGES:-}"
burst_sessions="${BENCH_BURST_SESSIONS:-}"
search_history="${BENCH_SEARCH_HISTORY:-}"
search_sessions="${BENCH_SEARCH_SESSIONS:-}"
startup_sessions="${BENCH_STARTUP_SESSIONS:-}"
startup_messages="${BENCH_STARTUP_MESSAGES:-}"
llm_idle_seconds="${BENCH_LLM_IDLE_SECONDS:-}"
idle_seconds="${BENCH_IDLE_SECONDS:-}"

while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --quick) quick=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || { echo "bench_all.sh: $1 needs a value (see --help)" >&2; exit 2; }
    case "$1" in
        --runs) runs="$2" ;;
        --out) out="$2" ;;
        --tree) tree="$2" ;;
        --label) label="$2" ;;
        --only) only="$2" ;;
        --offline-messages) offline_messages="$2" ;;
        --burst-sessions) burst_sessions="$2" ;;
        --search-history) search_history="$2" ;;
        --search-sessions) search_sessions="$2" ;;
        --startup-sessions) startup_sessions="$2" ;;
        --startup-messages) startup_messages="$2" ;;
        --llm-idle-seconds) llm_idle_seconds="$2" ;;
        --idle-seconds) idle_seconds="$2" ;;
        *) echo "bench_all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift 2
done

if [ "$quick" = 1 ]; then
    : "${runs:=1}" "${offline_messages:=10000}" "${burst_sessions:=10}" "${search_history:=10000}"
    : "${search_sessions:=100}" "${startup_sessions:=100}" "${startup_messages:=50}" "${llm_idle_seconds:=30}"
    : "${idle_seconds:=10}"
else
    : "${runs:=3}" "${offline_messages:=100000}" "${burst_sessions:=50}" "${search_history:=100000}"
    : "${search_sessions:=1000}" "${startup_sessions:=1000}" "${startup_messages:=200}" "${llm_idle_seconds:=300}"
    : "${idle_seconds:=120}"
fi
for value in "$runs" "$offline_messages" "$burst_sessions" "$search_history" "$search_sessions" \
             "$startup_sessions" "$startup_messages"; do
    case "$value" in ''|*[!0-9]*|0) echo "bench_all.sh: '$value' is not a positive whole number" >&2; exit 2 ;; esac
done
for value in "$llm_idle_seconds" "$idle_seconds"; do
    case "$value" in ''|*[!0-9.]*) echo "bench_all.sh: '$value' is not a number of seconds" >&2; exit 2 ;; esac
done
for bench in ${only//,/ }; do
    case "$bench" in consolidate|burst|search|tracker) ;;
        *) echo "bench_all.sh: unknown benchmark $bench (consolidate, burst, search, tracker)" >&2; exit 2 ;;
    esac
done

tree="$(cd "$tree" 2>/dev/null && pwd)" || { echo "bench_all.sh: no such tree" >&2; exit 2; }
if [ -z "$PYTHON" ]; then
    if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then PYTHON="$VIRTUAL_ENV/bin/python"
    elif [ -x "$tree/.venv/bin/python" ]; then PYTHON="$tree/.venv/bin/python"
    else PYTHON=python3
    fi
fi
"$PYTHON" -c 'import loguru' 2>/dev/null || {
    echo "bench_all.sh: $PYTHON lacks nanobotd's dependencies; activate its virtualenv or set PYTHON" >&2; exit 2; }
[ -f "$tree/nanobotd/__init__.py" ] && [ -d "$tree/scripts" ] || {
    echo "bench_all.sh: $tree is not a nanobotd checkout (no nanobotd/ and scripts/)" >&2; exit 2; }
if [ -z "$label" ]; then
    commit="$(git -C "$tree" rev-parse --short HEAD 2>/dev/null || true)"
    label="$(basename "$tree")${commit:+-$commit}"
fi
# Bytecode for the measured tree, as an installed nanobotd has it (pip compiles it at install): every daemon,
# nanobotctl and child process started then reads its modules' bytecode instead of compiling each one again.
# Where PYTHONDONTWRITEBYTECODE is set, nothing else writes it, and a daemon's start took 0.30 s instead of 0.17.
"$PYTHON" -m compileall -q "$tree/nanobotd" "$tree/tests/support" >/dev/null \
    || echo "bench_all.sh: could not compile $tree's bytecode; starts will compile it each time" >&2
folder="$out/$label"
mkdir -p "$folder" || exit 2
folder="$(cd "$folder" && pwd)"

echo "nanobotd benchmarks: tree $tree, label $label, $runs run(s) each, results in $folder ($PYTHON)"
echo "sizes: offline $offline_messages msgs; burst $burst_sessions sessions; search $search_history entries /" \
     "$search_sessions sessions; cold start $startup_sessions x $startup_messages; LLM idle ${llm_idle_seconds}s;" \
     "idle window ${idle_seconds}s"

run_one() {  # run_one BENCH N ARGS...: one run in the measured tree, its JSON and log saved
    local bench="$1" number="$2"
    shift 2
    local json="$folder/$bench-$number.json" log="$folder/$bench-$number.log"
    echo "$(date +%T) $bench run $number: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$folder/load.txt"
    rm -f "$json"
    if (cd "$tree" && PYTHONPATH="$tree" "$PYTHON" "$@" --json "$json") >"$log" 2>&1; then
        echo "   done ($(wc -l <"$log") lines of output in $log)"
    else
        echo "   FAILED with status $?; see $log (its figures will show as missing)"
    fi
}

for number in $(seq 1 "$runs"); do
    for bench in ${only//,/ }; do
        case "$bench" in
            consolidate)
                # the offline part always; a tree whose script has parts (--only) also runs the daemon part,
                # and the rewrite part where it has one
                if grep -q -- '"rewrite"' "$tree/scripts/bench_consolidate.py"; then
                    parts=(--only offline,daemon,rewrite)
                elif grep -q -- '"--only"' "$tree/scripts/bench_consolidate.py"; then
                    parts=(--only offline,daemon)
                else
                    parts=()
                fi
                sizes=(--quick)
                [ "$quick" = 1 ] || sizes=()
                # the message count is the script's own sizes unless it takes --messages
                if grep -q -- '"--messages"' "$tree/scripts/bench_consolidate.py"; then
                    sizes+=(--messages "$offline_messages")
                elif [ "$offline_messages" != "$([ "$quick" = 1 ] && echo 10000 || echo 100000)" ]; then
                    echo "   note: this tree's bench_consolidate.py takes no message count; it runs its own sizes"
                fi
                run_one consolidate "$number" scripts/bench_consolidate.py "${sizes[@]}" "${parts[@]}" ;;
            burst)
                if [ -f "$tree/scripts/bench_burst.py" ]; then
                    run_one burst "$number" scripts/bench_burst.py --runs 1 --sessions "$burst_sessions"
                else
                    echo "   this tree has no scripts/bench_burst.py: the burst figures will show as missing"
                fi ;;
            search)
                run_one search "$number" scripts/bench_search.py --history "$search_history" \
                    --sessions "$search_sessions" ;;
            tracker)
                tracker_sizes=(--sessions "$startup_sessions" --messages "$startup_messages"
                               --llm-idle-seconds "$llm_idle_seconds" --idle-seconds "$idle_seconds")
                [ "$quick" = 1 ] && tracker_sizes=(--quick "${tracker_sizes[@]}")
                run_one tracker "$number" scripts/bench_tracker.py "${tracker_sizes[@]}" ;;
        esac
    done
done

echo
"$PYTHON" "$HERE/bench_table.py" "$folder" --json "$folder/table.json" | tee "$folder/table.txt"
