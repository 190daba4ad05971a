"""A scripted day of the real nanobot 0.3.5 against the project's fake LLM: what nanobot itself archives.

Two sessions take long-ish turns under a small context window, so nanobot's own in-turn consolidation runs
several times; one session gets `/new`; then everything goes idle long enough for nanobot's idle compaction
(`idleCompactAfterMinutes`, 1 minute at the least). With --mcp-command, nanobot loads that MCP server as
"nanobotd" and one turn has the fake model call `mcp_nanobotd_memory_search` and answer from the result.
With a Remember, one turn mid-day has the fake model save a fact to memory/MEMORY.md with nanobot's own
`write_file` tool (Path.write_text, in place), and the last turn recalls it with `mcp_nanobotd_memory_search`.

Used by scripts/nanobot_day.py, which runs nanobotd beside it: setup_nanobot() and run_day(..., on_step=...)
hand over what nanobot's files looked like right after each step.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.support.fakellm import Text, ToolCalls  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "nanobot_runner.py"
SESSIONS = ("cli:alpha", "cli:beta")
SEARCH_TOOL = "mcp_nanobotd_memory_search"
SEARCH_TAG = "[memory-search]"
REMEMBER_TAG = "[remember]"
RECALL_TAG = "[recall]"
WRITE_TOOL = "write_file"
ARCHIVE_PROMPT = "Create a compact replacement checkpoint"
MARKER = re.compile(r"MSG-[a-z]+-\d+")
WORDS = ("kestrel staging server backup bucket restore drill friday quarterly report draft postgres "
         "replica lag alert threshold nightly cron rotation keys vault terraform module review").split()
START_SECONDS, STEP_SECONDS, CLOSE_SECONDS = 60, 150, 60


@dataclass
class NanobotSetup:
    """Where one nanobot instance lives and how to start it."""

    workdir: Path
    config_path: Path
    workspace: Path
    nanobot_python: Path
    env: dict


@dataclass
class Step:
    """What nanobot's files looked like after one step of the day."""

    name: str
    session: str
    ok: bool
    seconds: float
    sessions: dict  # key -> read_session() of its file
    history_entries: int
    detail: str = ""


@dataclass
class DayReport:
    """Everything run_day observed."""

    steps: list = field(default_factory=list)
    history: list = field(default_factory=list)
    session_sha256: dict = field(default_factory=dict)
    consolidation_requests: int = 0
    search_result: str | None = None
    search_result_has_expected: bool | None = None
    write_result: str | None = None
    recall_result: str | None = None


@dataclass
class Remember:
    """A fact the agent saves to its MEMORY.md mid-day with its own file tool, and the words it recalls it by."""

    fact: str
    query: str
    memory_file: Path | None = None  # set by run_day: <workspace>/memory/MEMORY.md


class ScriptedModel:
    """The fake model's words: replies to turns, fact-line checkpoints, and one memory_search call."""

    def __init__(self, search_query: str, search_expect: str | None, remember: Remember | None = None):
        self.search_query = search_query
        self.search_expect = search_expect
        self.remember = remember
        self.checkpoints = 0
        self.tool_results: list[str] = []
        self.results_by_tag: dict[str, str] = {}
        self._asked: str | None = None  # the tag of the turn whose tool call is out

    def __call__(self, request: dict) -> Any:
        messages = request.get("messages") or [{}]
        last = messages[-1]
        text = content_text(last.get("content"))
        if ARCHIVE_PROMPT in text:
            self.checkpoints += 1
            return Text(self.checkpoint(messages))
        if last.get("role") == "tool":
            self.tool_results.append(text)
            if self._asked is not None:
                self.results_by_tag[self._asked], self._asked = text, None
            return Text(f"From memory: {text[:200]}")
        offered = {tool.get("function", {}).get("name") for tool in request.get("tools") or []}
        call = self.tool_call(text, offered)
        if call is not None:
            return call
        markers = MARKER.findall(text)
        return Text(f"Noted {markers[-1] if markers else 'that'}. " + filler(60, seed=len(text)))

    def tool_call(self, text: str, offered: set) -> ToolCalls | None:
        """The tool call a tagged turn asks for: search, save the fact (the whole file, as write_file takes it),
        or recall it."""
        remember = self.remember
        if SEARCH_TAG in text and SEARCH_TOOL in offered:
            self._asked = SEARCH_TAG
            return ToolCalls([(SEARCH_TOOL, {"query": self.search_query, "limit": 3})])
        if remember is not None and REMEMBER_TAG in text and WRITE_TOOL in offered:
            self._asked = REMEMBER_TAG
            current = remember.memory_file.read_text(encoding="utf-8") if remember.memory_file.is_file() else ""
            content = current.rstrip("\n") + "\n\n" + remember.fact + "\n"
            return ToolCalls([(WRITE_TOOL, {"path": str(remember.memory_file), "content": content})])
        if remember is not None and RECALL_TAG in text and SEARCH_TOOL in offered:
            self._asked = RECALL_TAG
            return ToolCalls([(SEARCH_TOOL, {"query": remember.query, "limit": 5})])
        return None

    def checkpoint(self, messages: list) -> str:
        texts = (content_text(message.get("content")) for message in messages if message.get("role") != "system")
        markers = sorted(set(MARKER.findall(" ".join(texts))), key=lambda marker: int(marker.rsplit("-", 1)[1]))
        span = f"{markers[0]} .. {markers[-1]}" if markers else "no markers"
        return (f"- [durable] Checkpoint {self.checkpoints} covers {len(markers)} marked messages ({span}).\n"
                "- [ephemeral] The user is reviewing the kestrel backup rotation.")


def content_text(content: Any) -> str:
    """A message's text whether content is a string or a list of blocks."""
    if isinstance(content, list):
        return " ".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return content if isinstance(content, str) else ""


def filler(count: int, seed: int) -> str:
    """*count* deterministic words about the same small project."""
    return " ".join(WORDS[(seed + index * 7) % len(WORDS)] for index in range(count)) + "."


def litellm_tiktoken_dir() -> str | None:
    """The tiktoken encodings litellm ships: nanobot counts with cl100k_base offline instead of UTF-8 bytes."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    return str(folder) if folder.is_dir() else None


def nanobot_config(workspace: Path, api_base: str, *, context_window: int, max_tokens: int,
                   idle_minutes: int, mcp_command: list | None, mcp_env: dict | None) -> dict:
    """nanobot's config.json (camelCase keys): a custom OpenAI-compatible provider, small window, no dream."""
    defaults = {
        "workspace": str(workspace), "model": "fake-model", "provider": "custom",
        "maxTokens": max_tokens, "contextWindowTokens": context_window,
        "idleCompactAfterMinutes": idle_minutes, "idleCompactCheckIntervalSeconds": 1,
        "dream": {"intervalH": 8760},
    }
    config: dict = {"agents": {"defaults": defaults},
                    "providers": {"custom": {"apiKey": "sk-fake", "apiBase": api_base}}}
    if mcp_command:
        server = {"command": mcp_command[0], "args": list(mcp_command[1:]), "env": dict(mcp_env or {})}
        config["tools"] = {"mcpServers": {"nanobotd": server}}
    return config


def setup_nanobot(nanobot_python: Path, workdir: Path, api_base: str, *, context_window: int = 12000,
                  max_tokens: int = 1024, idle_minutes: int = 1, mcp_command: list | None = None,
                  mcp_env: dict | None = None) -> NanobotSetup:
    """Write a nanobot config dir and workspace under *workdir* (HOME too, so ~/.nanobot stays untouched)."""
    workdir = workdir.resolve()
    config_dir, home = workdir / "nanobot", workdir / "home"
    workspace = config_dir / "workspace"  # nanobot's default layout: ~/.nanobot/{config.json,workspace}
    for folder in (config_dir, workspace, home):
        folder.mkdir(parents=True, exist_ok=True)
    config = nanobot_config(workspace, api_base, context_window=context_window, max_tokens=max_tokens,
                            idle_minutes=idle_minutes, mcp_command=mcp_command, mcp_env=mcp_env)
    config_path = config_dir / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1", "LANG": "C.UTF-8"}
    if litellm_tiktoken_dir():
        env["TIKTOKEN_CACHE_DIR"] = litellm_tiktoken_dir()
    return NanobotSetup(workdir, config_path, workspace, Path(nanobot_python), env)


class NanobotProcess:
    """scripts/nanobot_runner.py under nanobot's python; every answer is awaited with a deadline."""

    def __init__(self, setup: NanobotSetup):
        self.log_path = setup.workdir / "nanobot-runner.log"
        self._log = open(self.log_path, "a", encoding="utf-8")
        self._process = subprocess.Popen(
            [str(setup.nanobot_python), str(RUNNER), "--config", str(setup.config_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=setup.env,
            cwd=setup.workdir,
        )
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._wait(START_SECONDS)

    def _read(self) -> None:
        for line in self._process.stdout:
            self._answers.put(json.loads(line))
        self._answers.put({"ok": False, "error": f"runner exited ({self._process.wait()}), see {self.log_path}"})

    def _wait(self, seconds: float) -> dict:
        try:
            return self._answers.get(timeout=seconds)
        except queue.Empty:
            return {"ok": False, "error": f"no answer within {seconds:.0f} s"}

    def ask(self, command: dict, seconds: float = STEP_SECONDS) -> dict:
        """Send one command and wait for its answer (at once an error if the runner is gone)."""
        if self._process.poll() is not None:
            return {"ok": False, "error": f"runner exited ({self._process.returncode}), see {self.log_path}"}
        try:
            self._process.stdin.write(json.dumps(command) + "\n")
            self._process.stdin.flush()
        except OSError as exc:
            return {"ok": False, "error": f"runner unreachable: {exc}"}
        return self._wait(seconds)

    def close(self) -> None:
        """Ask the runner to quit (it drains background archives), then make sure it is gone."""
        try:
            if self._process.poll() is None:
                self.ask({"op": "quit"}, CLOSE_SECONDS)
            self._process.wait(timeout=CLOSE_SECONDS)
        except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
            self._process.kill()
            self._process.wait()
        self._log.close()


def session_files(setup: NanobotSetup) -> dict:
    """Session key -> its file in <config dir>/sessions/<workspace-id>/, for the day's sessions that exist."""
    marker = setup.workspace / ".nanobot" / "workspace-id"
    if not marker.is_file():
        return {}
    folder = setup.config_path.parent / "sessions" / marker.read_text().strip()
    paths = {key: folder / (base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".jsonl") for key in SESSIONS}
    return {key: path for key, path in paths.items() if path.is_file()}


def read_session(path: Path) -> dict:
    """last_archived, messages, hidden checkpoints and unarchived conversation messages of one session file."""
    metadata, messages = {}, []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("_type") == "metadata":
            metadata = record
        elif "role" in record:
            messages.append(record)
    archived = metadata.get("last_archived", metadata.get("last_consolidated", 0))
    tail = messages[archived:]
    return {"last_archived": archived, "messages": len(messages),
            "hidden": sum(bool(m.get("_hidden_history")) for m in messages),
            "unarchived": sum(not m.get("_hidden_history") and not m.get("_command") for m in tail)}


def history_entries(setup: NanobotSetup) -> list:
    """nanobot's memory/history.jsonl records."""
    path = setup.workspace / "memory" / "history.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def observe(setup: NanobotSetup, name: str, session: str, answer: dict, started: float) -> Step:
    """A Step from the runner's answer and the files as they are now."""
    sessions = {key: read_session(path) for key, path in session_files(setup).items()}
    detail = answer.get("error", "") if not answer.get("ok") else ""
    return Step(name, session, bool(answer.get("ok")), round(time.monotonic() - started, 2), sessions,
                len(history_entries(setup)), detail)


def user_message(session: str, index: int) -> str:
    """A long-ish user message (about 260 cl100k tokens) with a unique marker."""
    marker = f"MSG-{session.split(':')[1]}-{index}"
    return f"{marker}: please keep this in mind. " + filler(220, seed=index * 13 + len(session))


class Day:
    """One scripted day: each method is a step that records what the files looked like after it."""

    def __init__(self, setup: NanobotSetup, runner: NanobotProcess, on_step: Callable[[Step], None] | None):
        self.setup, self.runner, self.on_step = setup, runner, on_step
        self.report = DayReport()

    def record(self, name: str, session: str, answer: dict, started: float) -> Step:
        step = observe(self.setup, name, session, answer, started)
        self.report.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return step

    def turn(self, session: str, message: str, name: str = "turn") -> Step:
        started = time.monotonic()
        answer = self.runner.ask({"op": "turn", "session": session, "message": message})
        return self.record(name, session, answer, started)

    def new(self, session: str) -> Step:
        """/new, then wait (bounded) for its background archive to reach history.jsonl."""
        started, before = time.monotonic(), len(history_entries(self.setup))
        answer = self.runner.ask({"op": "turn", "session": session, "message": "/new"})
        deadline = time.monotonic() + 30
        while len(history_entries(self.setup)) <= before and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.record("/new", session, answer, started)

    def idle(self, minutes: int) -> Step:
        """Stay idle past idleCompactAfterMinutes, in slices, until no session has unarchived messages."""
        started = time.monotonic()
        deadline = started + minutes * 60 + 45
        answer: dict = {"ok": True}
        while time.monotonic() < deadline and answer.get("ok"):
            answer = self.runner.ask({"op": "sleep", "seconds": 5})
            files = session_files(self.setup).values()
            if all(read_session(path)["unarchived"] == 0 for path in files):
                break
        return self.record(f"idle {minutes} min", "*", answer, started)


def run_day(setup: NanobotSetup, model: ScriptedModel, *, turns_per_session: int = 14, idle_minutes: int = 1,
            search: bool = False, on_step: Callable[[Step], None] | None = None) -> DayReport:
    """Run the day's steps against a started fake LLM and return what nanobot did."""
    runner = NanobotProcess(setup)
    if not runner.ready.get("ok"):
        runner.close()
        raise RuntimeError(f"nanobot did not start: {runner.ready.get('error')}")
    day = Day(setup, runner, on_step)
    remember = model.remember
    if remember is not None:
        remember.memory_file = setup.workspace / "memory" / "MEMORY.md"
    try:
        for index in range(1, turns_per_session + 1):
            for session in SESSIONS:
                day.turn(session, user_message(session, index))
            if remember is not None and index == turns_per_session // 2:
                day.turn(SESSIONS[0], f"{REMEMBER_TAG} Put this in your long-term memory file, please: "
                                      f"{remember.fact} MSG-alpha-remember", "remember")
        if search:
            day.turn(SESSIONS[0], f"{SEARCH_TAG} What did we decide about the backups? MSG-alpha-search", "search")
        if remember is not None:
            day.turn(SESSIONS[1], f"{RECALL_TAG} What do you know about it? MSG-beta-recall", "recall")
        day.new(SESSIONS[1])
        day.turn(SESSIONS[1], user_message(SESSIONS[1], turns_per_session + 1))
        if idle_minutes > 0:
            day.idle(idle_minutes)
    finally:
        runner.close()
    return finish_report(day.report, setup, model)


def finish_report(report: DayReport, setup: NanobotSetup, model: ScriptedModel) -> DayReport:
    report.history = history_entries(setup)
    report.session_sha256 = {key: hashlib.sha256(path.read_bytes()).hexdigest()
                             for key, path in session_files(setup).items()}
    report.consolidation_requests = model.checkpoints
    report.write_result = model.results_by_tag.get(REMEMBER_TAG)
    report.recall_result = model.results_by_tag.get(RECALL_TAG)
    if SEARCH_TAG in model.results_by_tag:
        report.search_result = model.results_by_tag[SEARCH_TAG]
        if model.search_expect is not None:
            report.search_result_has_expected = model.search_expect in report.search_result
    return report
