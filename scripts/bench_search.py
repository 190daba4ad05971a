#!/usr/bin/env python3
"""Search latency and index update time at scale: 100,000 history entries and 1,000 sessions.

Synthetic but realistic data is generated in a temporary directory (or --data-dir): a workspace with
SOUL.md, USER.md, a sectioned MEMORY.md, daily and archived notes, a history.jsonl of fact-line and
[RAW] entries, and nanobot session files (base64 names, metadata line, timestamped user/assistant
turns). Text mixes common English with a Zipf-distributed topical vocabulary, so posting lists are
as skewed as in real text.

Measured, each as median, p95 and p99:
  builtin     BuiltinIndex.search in-process (what the daemon runs on its executor); also its CPU time
              (cpu_*_ms: the thread's own time, what the search costs whatever else the machine runs)
  socket      GET /v1/search?q=... over the daemon's Unix socket (--socket PATH; else skipped)
  qmd         `qmd search QUERY --index NAME` on the same workspace's markdown (--qmd PATH; else skipped)
  update      refresh after one memory file changes (named path, and full fingerprint check), and
              after one message is appended to a large session

    scripts/bench_search.py [--history 100000] [--sessions 1000] [--socket PATH] [--qmd PATH] [--json FILE]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_daemon import save_figures  # noqa: E402

from nanobotd.index.builtin import BuiltinIndex  # noqa: E402

COMMON = ("the a to and of I you it is in that we for on was with this be have are not but at my so "
          "do what can just about like from if your me all will they get one would there how up out "
          "when know think today need should also really yes ok thanks please could time want make "
          "good new use going work maybe right now let check again still next week tomorrow").split()
SYLLABLES = ("ka lo mi ren tor vel an sul dri pe qua zen bor lin fa gro mu tes ni ral cho vin ep "
             "os ur ta ki dem lon sar wey").split()
ROLES = ["USER", "ASSISTANT"]
FACT_MARKS = ("permanent", "durable", "ephemeral", "correction")
START = datetime(2026, 1, 1, 8, 0)
BIG_SESSION_MESSAGES = 5000


class Text:
    """Sentences from common words and a Zipf-weighted topical vocabulary."""

    def __init__(self, rng: random.Random, vocabulary: int = 20000):
        self.rng = rng
        words = set()
        while len(words) < vocabulary:
            words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
        self.topical = sorted(words)
        rng.shuffle(self.topical)
        self.weights = [1 / (rank + 1) for rank in range(len(self.topical))]
        self.cumulative = []
        total = 0.0
        for weight in self.weights:
            total += weight
            self.cumulative.append(total)

    def topic_words(self, count: int) -> list[str]:
        return self.rng.choices(self.topical, cum_weights=self.cumulative, k=count)

    def sentence(self, words: int) -> str:
        topical = self.topic_words(max(1, words // 3))
        common = self.rng.choices(COMMON, k=words - len(topical))
        mixed = topical + common
        self.rng.shuffle(mixed)
        return " ".join(mixed).capitalize() + "."


def session_filename(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".jsonl"


def generate_or_reuse(root: Path, histories: int, sessions: int, seed: int) -> tuple[Path, Path, Path, Text]:
    """Generate the data, or reuse what an earlier run with the same sizes and seed left in *root*."""
    marker = root / "generated.json"
    wanted = {"history": histories, "sessions": sessions, "seed": seed}
    try:
        if json.loads(marker.read_text()) == wanted:
            text = Text(random.Random(seed))
            return root / "workspace", root / "sessions", root / "sessions" / session_filename("telegram:1"), text
    except (OSError, ValueError):
        pass
    generated = generate(root, histories, sessions, seed)
    marker.write_text(json.dumps(wanted))
    return generated


def generate(root: Path, histories: int, sessions: int, seed: int) -> tuple[Path, Path, Path, Text]:
    """Write the workspace and sessions; return (workspace, sessions_dir, big_session, text)."""
    rng = random.Random(seed)
    text = Text(rng)
    workspace = root / "workspace"
    memory = workspace / "memory"
    (memory / "archive").mkdir(parents=True, exist_ok=True)
    (workspace / "SOUL.md").write_text("# Soul\n\n## Style\n- Answer briefly.\n- Use bullet points.\n")
    (workspace / "USER.md").write_text("# User\n\n## Preferences\n" + "".join(
        f"- {text.sentence(10)}\n" for _ in range(12)))
    (memory / "MEMORY.md").write_text("# Memory\n\n" + "".join(
        f"## Topic {n}\n" + "".join(f"- {text.sentence(14)}\n" for _ in range(6)) + "\n" for n in range(30)))
    for day in range(60):
        folder = memory if day >= 50 else memory / "archive"
        stamp = (START + timedelta(days=day * 3)).strftime("%Y-%m-%d")
        (folder / f"{stamp}.md").write_text(f"# {stamp}\n\n" + "".join(
            f"## {title}\n" + "".join(f"- {text.sentence(12)}\n" for _ in range(4)) + "\n"
            for title in ("Topics", "Decisions", "Tool Activity", "Open Questions")))
    with open(memory / "history.jsonl", "w", encoding="utf-8") as handle:
        for cursor in range(1, histories + 1):
            moment = START + timedelta(minutes=5 * cursor)
            if rng.random() < 0.1:
                lines = [f"[{moment.isoformat()[:16]}] {rng.choice(ROLES)}: {text.sentence(rng.randint(8, 40))}"
                         for _ in range(rng.randint(2, 8))]
                content = f"[RAW] {len(lines)} messages\n" + "\n".join(lines)
            else:
                content = "\n".join(f"- [{rng.choice(FACT_MARKS)}] {text.sentence(rng.randint(6, 18))}"
                                    for _ in range(rng.randint(1, 6)))
            record = {"cursor": cursor, "timestamp": moment.strftime("%Y-%m-%d %H:%M"), "content": content,
                      "session_key": f"telegram:{rng.randint(1, sessions)}"}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    (memory / ".cursor").write_text(str(histories))
    sessions_dir = root / "sessions"
    sessions_dir.mkdir(parents=True, exist_ok=True)
    big = None
    for number in range(1, sessions + 1):
        count = BIG_SESSION_MESSAGES if number == 1 else rng.randint(20, 180)
        path = write_session(sessions_dir, f"telegram:{number}", count, text, rng,
                             START + timedelta(days=rng.randint(0, 300)))
        big = big or path
    return workspace, sessions_dir, big, text


def write_session(folder: Path, key: str, count: int, text: Text, rng: random.Random, start: datetime) -> Path:
    path = folder / session_filename(key)
    lines = [json.dumps({"_type": "metadata", "key": key, "created_at": start.isoformat(),
                         "updated_at": start.isoformat(), "metadata": {}, "last_archived": 0,
                         "last_consolidated": 0})]
    for index in range(count):
        role = "user" if index % 2 == 0 else "assistant"
        words = rng.randint(5, 30) if role == "user" else rng.randint(15, 90)
        lines.append(json.dumps({"role": role, "content": text.sentence(words),
                                 "timestamp": (start + timedelta(seconds=40 * index)).isoformat()}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_queries(text: Text, count: int, rng: random.Random) -> list[str]:
    """Keyword queries, questions and dated questions, like agents and users send."""
    queries = []
    for number in range(count):
        words = text.topic_words(rng.randint(1, 4))
        kind = number % 4
        if kind == 0:
            queries.append(" ".join(words))
        elif kind == 1:
            queries.append(f"what did we decide about {' '.join(words)}?")
        elif kind == 2:
            day = START + timedelta(days=rng.randint(0, 300))
            queries.append(f"what happened with {words[0]} on {day.day} {day.strftime('%B %Y')}")
        else:
            queries.append(f"{rng.choice(COMMON)} {' '.join(words)} {rng.choice(COMMON)}")
    return queries


def percentiles(samples: list[float], prefix: str = "") -> dict:
    """Median, p95 and p99 in milliseconds (keys p50_ms, p95_ms, p99_ms, each after *prefix*)."""
    ordered = sorted(samples)

    def at(share: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))], 2)

    return {f"{prefix}p50_ms": round(1000 * statistics.median(ordered), 2), f"{prefix}p95_ms": at(0.95),
            f"{prefix}p99_ms": at(0.99), **({} if prefix else {"samples": len(ordered)})}


def time_calls(function, items, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock seconds of each call (and its thread CPU seconds appended to *cpu*)."""
    samples = []
    for item in items:
        started, started_cpu = time.perf_counter(), time.thread_time()
        function(item)
        samples.append(time.perf_counter() - started)
        if cpu is not None:
            cpu.append(time.thread_time() - started_cpu)
    return samples


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (the daemon's control socket)."""

    def __init__(self, path: str, timeout: float = 30.0):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def socket_search(path: str, workspace_name: str | None, query: str) -> None:
    params = {"q": query, "limit": "10"}
    if workspace_name:
        params["workspace"] = workspace_name
    connection = UnixHTTPConnection(path)
    try:
        connection.request("GET", "/v1/search?" + urllib.parse.urlencode(params))
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"socket search answered {response.status}: {body[:200]!r}")
    finally:
        connection.close()


def qmd_bench(qmd: str, workspace: Path, root: Path, queries: list[str]) -> dict:
    """Index the workspace markdown with qmd (isolated config/cache) and time CLI BM25 searches."""
    env = dict(os.environ, QMD_CONFIG_DIR=str(root / "qmd" / "config"), XDG_CACHE_HOME=str(root / "qmd" / "cache"))
    name = "benchsearch"
    executable = shutil.which(qmd) if os.sep not in qmd else str(Path(qmd).resolve())
    if executable is None:
        return {"error": f"qmd executable {qmd!r} not found"}
    base = [executable, "--index", name]

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        done = subprocess.run(base + list(args), env=env, cwd=root, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"qmd {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
        return done

    started = time.perf_counter()
    run("collection", "add", str(workspace), "--name", name, "--mask",
        "SOUL.md,USER.md,memory/*.md,memory/archive/*.md")
    run("update")
    index_seconds = time.perf_counter() - started
    samples = time_calls(lambda query: run("search", query, "-n", "10", timeout=60), queries)
    return {"index_seconds": round(index_seconds, 2), **percentiles(samples)}


def update_bench(index: BuiltinIndex, workspace: Path, big_session: Path, text: Text, rounds: int) -> dict:
    """Refresh times after one memory file changes, and after one message is appended to a big session."""
    memory = workspace / "memory" / "MEMORY.md"
    named, full = [], []
    for round_number in range(rounds):
        with open(memory, "a", encoding="utf-8") as handle:
            handle.write(f"\n## Added {round_number}\n- {text.sentence(12)}\n")
        started = time.perf_counter()
        index.refresh([memory])
        named.append(time.perf_counter() - started)
        with open(memory, "a", encoding="utf-8") as handle:
            handle.write(f"- {text.sentence(8)}\n")
        started = time.perf_counter()
        index.refresh()
        full.append(time.perf_counter() - started)
    appended, windows = [], []
    for round_number in range(rounds):
        with open(big_session, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"role": "user", "content": text.sentence(20),
                                     "timestamp": f"2027-01-01T00:{round_number:02d}:00"}) + "\n")
        started = time.perf_counter()
        report = index.refresh([big_session])
        appended.append(time.perf_counter() - started)
        windows.append(report["units_added"])
    return {"memory_named_path": percentiles(named), "memory_full_check": percentiles(full),
            f"session_{BIG_SESSION_MESSAGES}_append": percentiles(appended),
            "session_append_units_added_max": max(windows) if windows else 0}


def main(argv: list[str] | None = None) -> int:
    """Generate the data, index it, measure, print (and optionally write JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=100_000, help="history.jsonl entries")
    parser.add_argument("--sessions", type=int, default=1000, help="session files")
    parser.add_argument("--queries", type=int, default=300, help="queries per measurement")
    parser.add_argument("--update-rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--data-dir", type=Path,
                        help="generate here and keep it, or reuse it when generated before with the same sizes "
                             "(point a daemon at it for --socket); default: a temp dir, removed")
    parser.add_argument("--socket", help="daemon control socket: also time GET /v1/search over it")
    parser.add_argument("--workspace-name", help="workspace query parameter for --socket")
    parser.add_argument("--qmd", help="qmd executable: also time `qmd search` on the same markdown")
    parser.add_argument("--qmd-queries", type=int, default=30)
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)

    root = args.data_dir or Path(tempfile.mkdtemp(prefix="bench-search-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict = {"history_entries": args.history, "sessions": args.sessions}
    try:
        started = time.perf_counter()
        workspace, sessions_dir, big_session, text = generate_or_reuse(root, args.history, args.sessions, args.seed)
        results["generate_seconds"] = round(time.perf_counter() - started, 1)
        # Built afresh each run, so the initial index time and size are those of a first start.
        shutil.rmtree(root / "bench-state", ignore_errors=True)
        index = BuiltinIndex(workspace, root / "bench-state" / "index.db", sessions_dir)
        started, started_cpu = time.perf_counter(), time.process_time()
        built = index.refresh()
        results["initial_index_seconds"] = round(time.perf_counter() - started, 1)
        results["initial_index_cpu_seconds"] = round(time.process_time() - started_cpu, 2)
        results["index"] = index.stats()
        results["initial_units"] = built["units_added"]
        queries = make_queries(text, args.queries, random.Random(args.seed + 1))
        results["first_search_ms"] = round(1000 * time_calls(lambda query: index.search(query, limit=10),
                                                             queries[:1])[0], 1)
        time_calls(lambda query: index.search(query, limit=10), queries[:20])
        cpu: list[float] = []
        results["builtin"] = percentiles(time_calls(lambda query: index.search(query, limit=10), queries, cpu))
        results["builtin"].update(percentiles(cpu, "cpu_"))
        if args.socket:
            results["socket"] = percentiles(time_calls(
                lambda query: socket_search(args.socket, args.workspace_name, query), queries))
        else:
            results["socket"] = "skipped: no --socket given"
        if args.qmd:
            results["qmd"] = qmd_bench(args.qmd, workspace, root, queries[: args.qmd_queries])
        else:
            results["qmd"] = "skipped: no --qmd given"
        results["update"] = update_bench(index, workspace, big_session, text, args.update_rounds)
        index.close()
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_results(results)
    save_figures(args.json, results)
    return 0


def print_results(results: dict) -> None:
    """A readable summary."""
    stats = results["index"]
    print(f"data: {results['history_entries']} history entries, {results['sessions']} sessions "
          f"(generated in {results['generate_seconds']}s)")
    print(f"initial index: {results['initial_index_seconds']}s, {stats['units']} units, {stats['files']} files, "
          f"{stats['db_bytes'] / 1e6:.0f} MB (database and WAL), CPU {results['initial_index_cpu_seconds']}s; "
          f"first search {results['first_search_ms']} ms")
    for name in ("builtin", "socket", "qmd"):
        row = results[name]
        if isinstance(row, dict) and "error" in row:
            row = row["error"]
        if isinstance(row, str):
            print(f"search {name:<8} {row}")
        else:
            extra = f" (qmd index {row['index_seconds']}s)" if "index_seconds" in row else ""
            print(f"search {name:<8} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms"
                  f"  p99 {row['p99_ms']:8.2f} ms  n={row['samples']}{extra}")
            if "cpu_p50_ms" in row:
                print(f"search {name + ' cpu':<8} p50 {row['cpu_p50_ms']:8.2f} ms  p95 {row['cpu_p95_ms']:8.2f} ms"
                      f"  p99 {row['cpu_p99_ms']:8.2f} ms")
    for name, row in results["update"].items():
        if isinstance(row, dict):
            print(f"update {name:<24} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  n={row['samples']}")
    most = results["update"]["session_append_units_added_max"]
    print(f"update session append: at most {most} units added per message")


if __name__ == "__main__":
    sys.exit(main())
