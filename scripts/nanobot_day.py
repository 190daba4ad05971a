#!/usr/bin/env python3
"""A scripted day of the real nanobot 0.3.5 with nanobotd beside it (defaults, auto mode): who archived what.

nanobot (installed in its own venv by scripts/install-nanobot.sh) takes long-ish turns under a small context
window, so its own in-turn consolidation runs several times; one session gets `/new`; then everything idles
past nanobot's idle compaction. nanobotd watches the same workspace with its defaults (auto mode) and the
project's fake LLM; nanobot loads `nanobotctl mcp` as its MCP server "nanobotd", and one turn has the fake
model call `mcp_nanobotd_memory_search`. Printed at the end:

- messages archived by nanobot, by nanobotd, and by both (archived twice: must be 0);
- nanobotd's flushes, and how many landed before nanobot's compaction of the same turns;
- whether the session files were left as nanobot wrote them (sha256 after nanobot's last write and at the end);
- the memory_search result nanobot sent back to the model, and whether it holds the known fact;
- a fact the agent saved to memory/MEMORY.md mid-day with its own write_file tool: seconds from that write
  (the file's mtime) to the first nanobotd search that finds it, its rank then, the seconds until it ranks
  first, and the rank of MEMORY.md in the agent's own recall over MCP at the end of the day.

    scripts/nanobot_day.py --workdir /tmp/day [--nanobot-python PATH] [--turns 14] [--idle-minutes 1]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nanobot_agent import (  # noqa: E402
    SESSIONS,
    WORDS,
    Remember,
    ScriptedModel,
    Step,
    history_entries,
    litellm_tiktoken_dir,
    run_day,
    session_files,
    setup_nanobot,
)

from tests.support.fakellm import FakeLLM, Text  # noqa: E402

FLUSH_MARK = "You keep an agent's daily notes"
FLUSH_REPLY = ("## Topics\n- Reviewing the kestrel backup rotation.\n{turns}## Decisions\n"
               "- Kestrel backups go to the cold bucket; restore drills run on Fridays.\n"
               "## Tool Activity\n## Open Questions\n")
KNOWN_FACT = "restore drills run on Fridays"  # written by nanobotd's flush, asked for by the model
SEARCH_QUERY = "cold bucket"
MARKER = re.compile(r"MSG-([a-z]+)-(\d+)")
RANGE = re.compile(r"\((MSG-[a-z]+-\d+) \.\. (MSG-[a-z]+-\d+)\)")
SETTLE_SECONDS = 60
REMEMBERED = Remember(fact="- The zanzibar trip starts on the ninth of March; the ferry leaves Dar es Salaam at 07:00.",
                      query="zanzibar trip")
PROBE_POLL_SECONDS = 0.05
PROBE_SECONDS = 120  # how long the probe looks for the saved fact in nanobotd's search before it gives up


class DayModel(ScriptedModel):
    """nanobot's scripted words, plus what nanobotd's flush asks for (daily-note facts)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flush_requests = 0

    def __call__(self, request: dict):
        system = " ".join(str(message.get("content")) for message in request.get("messages") or []
                          if message.get("role") == "system")
        if FLUSH_MARK in system:
            self.flush_requests += 1
            transcript = " ".join(str(message.get("content")) for message in request["messages"][1:])
            seen = sorted({match.group(0) for match in MARKER.finditer(transcript)})
            turns = f"- Turns {', '.join(seen)} were about the kestrel backups.\n" if seen else ""
            return Text(FLUSH_REPLY.format(turns=turns))
        return super().__call__(request)


@dataclass
class Timeline:
    """What the files looked like after each nanobot step, and when nanobot compacted each session."""

    started: float = field(default_factory=time.time)
    compactions: list = field(default_factory=list)  # (wall time, session, step name)
    last_marks: dict = field(default_factory=dict)
    last_sha256: dict = field(default_factory=dict)
    setup: object = None

    def on_step(self, step: Step) -> None:
        now = time.time()
        for key, state in step.sessions.items():
            before = self.last_marks.get(key)
            if before is not None and (state["last_archived"] > before or step.name == "/new" and step.session == key):
                self.compactions.append((now, key, step.name))
            self.last_marks[key] = state["last_archived"]
        self.last_sha256 = {key: sha256(path) for key, path in session_files(self.setup).items()}


class FreshnessProbe:
    """Watches MEMORY.md for the fact the agent saves, then asks nanobotd's search until it finds it.

    A thread of its own, so the clock starts at the agent's write (the file's mtime), not when the turn that
    wrote it ends; each search is a `nanobotctl search` as a user or the agent's skill runs it.
    """

    def __init__(self, memory_file: Path, remember: Remember):
        self.memory_file, self.remember = memory_file, remember
        self.daemon: Nanobotd | None = None
        self.written: float | None = None
        self.found: float | None = None
        self.found_rank: int | None = None
        self.first: float | None = None
        self.searches = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="freshness-probe")

    def start(self, daemon: Nanobotd) -> FreshnessProbe:
        self.daemon = daemon
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + 3600
        while self.written is None and time.monotonic() < deadline:
            try:
                if self.remember.fact in self.memory_file.read_text(encoding="utf-8"):
                    self.written = self.memory_file.stat().st_mtime
            except OSError:
                pass
            time.sleep(0.02)
        deadline = time.monotonic() + PROBE_SECONDS
        while self.first is None and time.monotonic() < deadline:
            rank = self._rank()
            if rank is not None and self.found is None:
                self.found, self.found_rank = time.time(), rank
            if rank == 1:
                self.first = time.time()
            time.sleep(PROBE_POLL_SECONDS)

    def _rank(self) -> int | None:
        """The rank of the saved fact's MEMORY.md hit in one search, or None when it is not among the hits."""
        self.searches += 1
        try:
            hits = self.daemon.json("search", self.remember.query, "--limit", "10")["hits"]
        except RuntimeError:
            return None
        for rank, hit in enumerate(hits, 1):
            if hit["path"].endswith("memory/MEMORY.md") and "zanzibar" in (hit.get("text") or hit["snippet"]):
                return rank
        return None

    def figures(self) -> dict:
        def since_write(moment: float | None) -> float | None:
            return round(moment - self.written, 3) if moment is not None and self.written is not None else None

        return {"saved fact: seconds from the agent's write to the first search that finds it":
                since_write(self.found),
                "saved fact: its rank in that search": self.found_rank,
                "saved fact: seconds from the write until it ranks first": since_write(self.first),
                "saved fact: searches asked": self.searches}


def recall_rank(result: str | None) -> tuple[int | None, str | None]:
    """(rank of memory/MEMORY.md, the first hit's place) in the memory_search text nanobot sent the model."""
    if not result:
        return None, None
    places = re.findall(r"^\[\d+\] \S+ · (\S+)", result, re.MULTILINE)
    rank = next((index for index, place in enumerate(places, 1) if place.endswith("memory/MEMORY.md")), None)
    return rank, places[0] if places else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Nanobotd:
    """nanobotd as a user runs it: its own config (defaults, auto mode), a subprocess, nanobotctl."""

    def __init__(self, workdir: Path, workspace: Path, home: Path, fake: FakeLLM, log_level: str = "INFO"):
        self.socket = workdir / "nanobotd-run" / "nanobotd.sock"
        self.config = workdir / "nanobotd.toml"
        self.log = workdir / "nanobotd.log"
        self.config.write_text(f'[daemon]\nsocket = "{self.socket}"\nstate_dir = "{workdir / "nanobotd-state"}"\n'
                               f'log_level = "{log_level}"\n\n'
                               f'[llm]\nmodel = "{fake.model}"\napi_base = "{fake.base_url}"\n\n'
                               f'[[workspaces]]\npath = "{workspace}"\nname = "day"\n')
        self.env = dict(os.environ, HOME=str(home))
        self.bin = Path(sys.executable).with_name("nanobotctl")
        self.process: subprocess.Popen | None = None

    def start(self) -> Nanobotd:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([str(Path(sys.executable).with_name("nanobotd")), "run", "--config",
                                             str(self.config)], stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nanobotd exited, see {self.log}")
            if self.socket.exists() and self.ctl("status").returncode == 0:
                return self
            time.sleep(0.2)
        raise RuntimeError(f"nanobotd did not answer, see {self.log}")

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin), "--socket", str(self.socket), *args], capture_output=True, text=True,
                              timeout=60, env=self.env)

    def json(self, *args: str) -> dict:
        answer = self.ctl("--json", *args)
        if answer.returncode != 0:
            raise RuntimeError(f"nanobotctl {' '.join(args)} failed: {answer.stderr.strip()}")
        return json.loads(answer.stdout)

    def settle(self) -> None:
        """Wait until no run is queued or running (bounded)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            runs = self.json("runs", "--limit", "200")["runs"]
            if not any(run["state"] in ("queued", "started") for run in runs):
                return
            time.sleep(1)

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.terminate()
        return self.process.wait(timeout=60)


def markers_in(text: str) -> set[str]:
    """The MSG markers a history entry covers: listed in raw transcripts, or as a range in a checkpoint."""
    found = {match.group(0) for match in MARKER.finditer(text)}
    for first, last in RANGE.findall(text):
        name, low = MARKER.match(first).groups()
        high = int(MARKER.match(last).group(2))
        found |= {f"MSG-{name}-{number}" for number in range(int(low), high + 1)}
    return found


def archived_markers(entries: list[dict]) -> tuple[set[str], set[str]]:
    """(markers archived by nanobot, markers archived by nanobotd), from history.jsonl."""
    by_agent, by_daemon = set(), set()
    for entry in entries:
        (by_daemon if "nanobotd_span" in entry else by_agent).update(markers_in(entry.get("content", "")))
    return by_agent, by_daemon


def flush_timing(daemon: Nanobotd, timeline: Timeline) -> tuple[list, int]:
    """Each written flush and whether it finished before nanobot's next compaction of that session."""
    flushes = [run for run in daemon.json("runs", "--kind", "flush", "--limit", "200")["runs"]
               if run["state"] == "finished"]
    rows, before = [], 0
    for run in flushes:
        full = daemon.json("run", run["run_id"])["run"]
        finished = full.get("finished_at_epoch") or time.mktime(time.strptime(run["finished_at"], "%Y-%m-%dT%H:%M:%S"))
        started = time.mktime(time.strptime(run["started_at"], "%Y-%m-%dT%H:%M:%S"))
        later = [moment for moment, key, _ in timeline.compactions if key == run["session_key"] and moment >= started]
        landed = bool(later) and finished <= min(later) + 1.0  # the ledger keeps whole seconds
        before += landed and run["outcome"] == "written"
        rows.append((run["run_id"], run["session_key"], run["outcome"], landed))
    return rows, before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, type=Path, help="nanobot and nanobotd keep everything here")
    parser.add_argument("--nanobot-python", type=Path, help="default: what scripts/install-nanobot.sh prints")
    parser.add_argument("--turns", type=int, default=14, help="turns per session before /new")
    parser.add_argument("--context-window", type=int, default=12000)
    parser.add_argument("--idle-minutes", type=int, default=1, help="nanobot's idleCompactAfterMinutes")
    parser.add_argument("--log-level", default="INFO", help="nanobotd's log level (its log: WORKDIR/nanobotd.log)")
    parser.add_argument("--model-seconds", type=float, default=1.0,
                        help="how long the fake model takes per request (a real one takes seconds)")
    parser.add_argument("--seed-messages", type=int, default=0,
                        help="start from a nanobot that has run before: N old messages at the start of each day "
                             "session (no markers) and an idle old session cli:old of N (MSG-old-i), written "
                             "before either starts")
    args = parser.parse_args(argv)
    nanobot_python = args.nanobot_python or Path(subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "install-nanobot.sh")], check=True, capture_output=True,
        text=True).stdout.strip())
    if litellm_tiktoken_dir() is None:
        print("litellm's tiktoken files not found: nanobot would count UTF-8 bytes", file=sys.stderr)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model = DayModel(SEARCH_QUERY, KNOWN_FACT, REMEMBERED)
    timeline = Timeline()
    with FakeLLM(default=model, latency=args.model_seconds) as fake:
        nanobotctl = Path(sys.executable).with_name("nanobotctl")
        socket = workdir / "nanobotd-run" / "nanobotd.sock"
        setup = setup_nanobot(nanobot_python, workdir, fake.base_url, context_window=args.context_window,
                              idle_minutes=args.idle_minutes, mcp_command=[str(nanobotctl), "mcp", "--socket",
                                                                            str(socket)])
        timeline.setup = setup
        if args.seed_messages:
            seed_sessions(setup, args.seed_messages)
        daemon = Nanobotd(workdir, setup.workspace, workdir / "home", fake, args.log_level).start()
        probe = FreshnessProbe(setup.workspace / "memory" / "MEMORY.md", REMEMBERED).start(daemon)
        try:
            report = run_day(setup, model, turns_per_session=args.turns, idle_minutes=args.idle_minutes,
                             search=True, on_step=timeline.on_step)
            daemon.settle()
            figures = collect(daemon, setup, timeline, report)
            figures.update(probe.figures())
        finally:
            code = daemon.stop()
    figures["nanobotd exit code"] = code
    print_figures(report, figures)
    return 0 if figures["archived twice"] == 0 and all(step.ok for step in report.steps) else 1


def seed_sessions(setup, count: int) -> None:
    """Session files as an earlier nanobot left them, in the folder this workspace's id names (made here, as
    nanobot makes it): *count* old messages at the start of each day session, and an idle session cli:old."""
    marker = setup.workspace / ".nanobot" / "workspace-id"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(hashlib.md5(str(setup.workspace).encode()).hexdigest())
    folder = setup.config_path.parent / "sessions" / marker.read_text()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".workspace").write_text(f"{setup.workspace}\n")  # the namespace's owner, as nanobot records it
    for key in (*SESSIONS, "cli:old"):
        name = key.split(":")[1]
        lines = [{"_type": "metadata", "key": key, "created_at": "2026-10-01T09:00:00.000000",
                  "updated_at": "2026-10-01T18:00:00.000000", "metadata": {}, "last_archived": 0,
                  "last_consolidated": 0}]
        for index in range(count):
            tag = f"MSG-old-{index}: " if key == "cli:old" else f"earlier talk {index} in {name}: "
            lines.append({"role": "user" if index % 2 == 0 else "assistant",
                          "content": tag + " ".join(WORDS[(index + word) % len(WORDS)] for word in range(200)),
                          "timestamp": f"2026-10-01T{9 + index * 8 // max(count, 1):02d}:{index % 60:02d}:00"})
        path = folder / (base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".jsonl")
        path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")


def collect(daemon: Nanobotd, setup, timeline: Timeline, report) -> dict:
    """Every figure the day is judged by, read from the files and through nanobotctl."""
    by_agent, by_daemon = archived_markers(history_entries(setup))
    status = daemon.json("status")["workspaces"][0]
    flushes, before = flush_timing(daemon, timeline)
    final = {key: sha256(path) for key, path in session_files(setup).items()}
    return {
        "consolidation mode": status.get("consolidation_mode"),
        "user messages archived by nanobot": len(by_agent),
        "user messages archived by nanobotd": len(by_daemon),
        "archived twice": len(by_agent & by_daemon) + status.get("archived_twice", 0),
        "nanobotd archived_twice metric": status.get("archived_twice"),
        "nanobot compactions": len(timeline.compactions),
        "flushes written": sum(row[2] == "written" for row in flushes),
        "flushes landed before nanobot's compaction of those turns": before,
        "flush runs": flushes,
        "session files untouched": all(final.get(key) == digest for key, digest in timeline.last_sha256.items()),
        "session sha256 after nanobot's last write": timeline.last_sha256,
        "session sha256 at the end": final,
    }


def print_figures(report, figures: dict) -> None:
    turns = [step for step in report.steps if step.name in ("turn", "search")]
    print(f"nanobot turns: {len(turns)} ({sum(step.ok for step in turns)} ok); history entries: {len(report.history)}")
    for step in report.steps:
        if not step.ok:
            print(f"  step {step.name} {step.session} failed: {step.detail[:300]}")
    for name, value in figures.items():
        if name == "flush runs":
            for run_id, key, outcome, landed in value:
                print(f"  flush {run_id} {key}: {outcome}, {'before' if landed else 'NOT before'} nanobot's compaction")
            continue
        print(f"{name}: {value}")
    print(f"memory_search result nanobot sent back to the model: {report.search_result!r}"[:400])
    print(f"it holds the known fact ({KNOWN_FACT!r}): {report.search_result_has_expected}")
    print(f"write_file result nanobot sent back to the model: {report.write_result!r}"[:300])
    rank, first = recall_rank(report.recall_result)
    print(f"recall over MCP ({REMEMBERED.query!r}): MEMORY.md ranks {rank}; first hit: {first}")
    print(f"recall result nanobot sent back to the model: {report.recall_result!r}"[:600])


if __name__ == "__main__":
    sys.exit(main())
