"""Control API answer times against a running daemon: `nanobotctl status`, GET /v1/status, MCP memory_search.

    .venv/bin/python scripts/bench_api.py [--tree DIR] [--runs 20]

A daemon of *--tree* (default: this checkout; give an exported copy of another commit to compare) serves one
workspace with a MEMORY.md, 2,000 history entries and a session. Printed (medians, p95): a `nanobotctl status`
process from spawn to exit, GET /v1/status over the socket from this process, one MCP `memory_search` call
through a running `nanobotctl mcp`, and the daemon's RSS once idle.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[1]
CTL = "import sys; from nanobotd.cli.nanobotctl import main; sys.exit(main())"
WORDS = "deploy kubernetes cluster invoice postgres backup garden tomato recipe holiday flight".split()


def write_workspace(workspace: Path) -> None:
    memory = workspace / "memory"
    (workspace / "sessions").mkdir(parents=True)
    memory.mkdir()
    (memory / "MEMORY.md").write_text("# Memory\n\n## Work\n- the postgres backup runs nightly\n")
    with open(memory / "history.jsonl", "w") as history:
        for cursor in range(1, 2001):
            words = " ".join(WORDS[(cursor * k) % len(WORDS)] for k in (1, 3, 7))
            history.write(json.dumps({"cursor": cursor, "timestamp": "2026-01-01 10:00",
                                      "content": f"- talked about {words} ({cursor})"}) + "\n")
    lines = [json.dumps({"_type": "metadata", "key": "cli:direct", "created_at": "2026-01-01T10:00:00",
                         "updated_at": "2026-01-01T10:00:00", "metadata": {}, "last_consolidated": 0})]
    lines += [json.dumps({"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n} about postgres",
                          "timestamp": "2026-01-01T10:00:00"}) for n in range(40)]
    (workspace / "sessions" / "cli_direct.jsonl").write_text("\n".join(lines) + "\n")


def get(path: str, target: str) -> dict:
    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)

    connection = UnixConnection("nanobotd", timeout=10)
    try:
        connection.request("GET", target)
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"{name:<28} median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms"


async def mcp_search_times(tree: Path, socket_path: Path, runs: int) -> list[float]:
    params = StdioServerParameters(command=sys.executable, args=["-c", CTL, "--socket", str(socket_path), "mcp"],
                                   env={"PYTHONPATH": str(tree), "PATH": os.environ.get("PATH", "")}, cwd=str(tree))
    times = []
    async with stdio_client(params) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream) as client:
            await client.initialize()
            for run in range(runs + 2):
                started = time.perf_counter()
                result = await client.call_tool("memory_search", {"query": WORDS[run % len(WORDS)]})
                if run >= 2:  # the first calls warm the server's imports
                    times.append(time.perf_counter() - started)
                assert not result.is_error, result.content
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=REPO)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    tree = args.tree.resolve()
    folder = Path(tempfile.mkdtemp(prefix="nbapi-", dir="/tmp"))
    socket_path = folder / "run" / "nanobotd.sock"
    workspace = folder / "ws"
    write_workspace(workspace)
    config = folder / "nanobotd.toml"
    config.write_text(f'[daemon]\nsocket = "{socket_path}"\nstate_dir = "{folder / "state"}"\n'
                      f'[[workspaces]]\npath = "{workspace}"\nname = "ws"\n')
    env = dict(os.environ, PYTHONPATH=str(tree), HOME=str(folder), XDG_RUNTIME_DIR=str(folder),
               XDG_CONFIG_HOME=str(folder), XDG_STATE_HOME=str(folder))
    with open(folder / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "nanobotd.cli.nanobotd", "run", "--config", str(config)],
                                  cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status = get(str(socket_path), "/v1/status")
                if status["workspaces"][0].get("last_reconcile"):
                    break
            except (OSError, KeyError, ValueError, IndexError):
                pass
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"the daemon did not start; see {folder / 'daemon.log'}")
            time.sleep(0.2)
        time.sleep(3)  # the start-up index refresh
        ctl = []
        for _ in range(args.runs):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", CTL, "--socket", str(socket_path), "status"], cwd=tree, env=env,
                           check=True, capture_output=True)
            ctl.append(time.perf_counter() - started)
        direct = []
        for _ in range(args.runs * 10):
            started = time.perf_counter()
            get(str(socket_path), "/v1/status")
            direct.append(time.perf_counter() - started)
        searches = asyncio.run(mcp_search_times(tree, socket_path, args.runs))
        time.sleep(2)
        print(f"tree {tree}")
        print(summary("nanobotctl status (process)", ctl))
        print(summary("GET /v1/status (socket)", direct))
        print(summary("MCP memory_search (call)", searches))
        print(f"{'daemon idle RSS':<28} {rss_mb(daemon.pid):.1f} MB")
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
