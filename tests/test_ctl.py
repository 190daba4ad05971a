"""nanobotctl against a real ControlServer with canned handlers: in-process and as a subprocess."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from nanobotd.cli import client, invocation, render
from nanobotd.cli.commands import jobs
from nanobotd.cli import nanobotctl as ctl
from nanobotd.api.router import ApiError, Request, Response, Router
from nanobotd.api.server import ControlServer

NANOBOTCTL = Path(sys.executable).with_name("nanobotctl")
HEAVY_MODULES = ("loguru", "litellm", "git", "watchdog", "sdnotify", "apscheduler", "tiktoken", "nanobotd.api")
ALLOWED_OWN_MODULES = {"nanobotd", "nanobotd.cli", "nanobotd.cli.client", "nanobotd.cli.invocation",
                       "nanobotd.cli.nanobotctl", "nanobotd.cli.render", "nanobotd.cli.commands",
                       "nanobotd.cli.commands.jobs", "nanobotd.cli.commands.reports", "nanobotd.cli.commands.search",
                       "nanobotd.cli.commands.sessions", "nanobotd.config", "nanobotd.config.paths"}

STATUS = {
    "version": "0.1.0", "pid": 4321, "uptime_seconds": 3725,
    "workspaces": [
        {"name": "main", "path": "/srv/ws", "sessions_dir": "/srv/ws/sessions", "sessions_watched": 3,
         "unarchived_messages": 12, "unarchived_tokens": 3400,
         "watcher": {"healthy": True, "mode": "inotify", "last_reconcile": "2025-01-01T10:00:00"},
         "llm_mode": "openai/gpt-4o-mini", "git": {"head": "abc123", "dirty": False},
         "jobs": {"dream": {"last_success": "2025-01-01T04:15:00", "next_run": "2025-01-02T04:15:00",
                            "running": False},
                  "lifecycle": {"last_success": None, "next_run": "2025-01-02T04:45:00", "running": True}},
         "search": {"backend": "builtin", "documents": 120}},
        {"name": "second", "path": "/srv/ws2", "llm_mode": "offline", "watcher": {"healthy": False}},
    ],
}


class Daemon:
    """Canned control API handlers recording what the CLI sent."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.run_states: dict[str, list[str]] = {}
        self.router = Router()
        for method, path, handler in (
            ("GET", "/v1/status", self.status), ("GET", "/v1/sessions", self.sessions),
            ("GET", "/v1/sessions/{key}", self.session), ("GET", "/v1/runs", self.runs),
            ("GET", "/v1/runs/{run_id}", self.run), ("POST", "/v1/consolidate", self.queue),
            ("POST", "/v1/flush", self.queue), ("POST", "/v1/dream", self.dream),
            ("GET", "/v1/dream-log", self.dream_log), ("POST", "/v1/restore", self.restore),
            ("POST", "/v1/lifecycle", self.lifecycle), ("GET", "/v1/audit", self.audit),
            ("GET", "/v1/metrics", self.metrics), ("GET", "/v1/search", self.search),
            ("GET", "/v1/context", self.context), ("POST", "/v1/reindex", self.reindex),
        ):
            self.router.add(method, path, self.recorded(handler))

    def recorded(self, handler):
        async def record(request: Request):
            self.requests.append(request)
            return await handler(request)

        return record

    async def status(self, request: Request) -> dict:
        return STATUS

    async def sessions(self, request: Request) -> dict:
        return {"sessions": [
            {"workspace": "main", "key": "telegram:42", "messages": 120, "unarchived_messages": 7,
             "unarchived_tokens": 900, "agent_archived": 100, "daemon_archived": 13, "corrupt_lines": 0,
             "updated_at": "2025-01-01T09:00:00", "state": "idle"},
            {"workspace": "main", "key": "cli:direct", "messages": 5, "unarchived_messages": 5,
             "unarchived_tokens": 80, "agent_archived": 0, "daemon_archived": 0, "corrupt_lines": 2,
             "updated_at": None, "state": "watching"}]}

    async def session(self, request: Request) -> dict:
        if request.params["key"] == "nope":
            raise ApiError(404, "unknown_session", "no session 'nope' in workspace main")
        return {"session": {"key": request.params["key"], "messages": 3, "budget": 190000,
                            "last_run": {"run_id": "r7", "state": "done"}}}

    async def runs(self, request: Request) -> dict:
        return {"runs": [{"run_id": "r1", "kind": request.query.get("kind", "dream"), "workspace": "main",
                          "session_key": None, "state": "done", "outcome": "written",
                          "started_at": "2025-01-01T04:15:00", "finished_at": "2025-01-01T04:16:00"}],
                "query": request.query}

    async def run(self, request: Request) -> dict:
        run_id = request.params["run_id"]
        states = self.run_states.get(run_id) or ["done"]
        state = states.pop(0) if len(states) > 1 else states[0]
        return {"run": {"run_id": run_id, "kind": "consolidate", "state": state,
                        "manifest": {"files": ["memory/history.jsonl"], "cursor": [10, 12]}}}

    async def queue(self, request: Request) -> Response:
        session = request.body_value("session", str)
        return Response(202, {"run_id": f"run-{session}"})

    async def dream(self, request: Request) -> Response:
        return Response(202, {"run_ids": ["d-main", "d-second"]})

    async def dream_log(self, request: Request) -> dict:
        return {"commit": {"sha": "abc123", "message": "dream: tidy USER.md\n\nNanobot-Run: r9\n",
                           "author": "nanobotd", "date": "2025-01-01T04:16:00",
                           "diff": "--- a/USER.md\n+++ b/USER.md\n@@ -1 +1 @@\n-old\n+new\n"}}

    async def restore(self, request: Request) -> Response | dict:
        body = request.json_object()
        if body.get("dry_run"):
            return {"plan": [f"revert {body['target']}", "restore memory/MEMORY.md"]}
        return Response(202, {"run_id": "restore-1"})

    async def lifecycle(self, request: Request) -> Response | dict:
        if request.json_object().get("dry_run"):
            return {"plan": ["move memory/2024-12-01.md to memory/archive/"]}
        return Response(202, {"run_id": "life-1"})

    async def audit(self, request: Request) -> dict:
        return {"workspaces": [{"name": "main", "plan": ["memory/ ok"], "state": {"dream_cursor": 40},
                                "problems": [{"problem": "USER.md missing", "fix": "create USER.md"}]}]}

    async def metrics(self, request: Request) -> dict:
        return {"since": request.query.get("since"), "rows": [
            {"kind": "consolidate", "workspace": "main", "total": 10, "written": 8, "no_change": 1,
             "guard_rejected": 0, "raw_fallback": 1, "error": 0, "rates": {"error": 0.0}, "tokens": 12345,
             "latency_ms_p50": 800, "latency_ms_p95": 2100, "restored": 0}]}

    async def search(self, request: Request) -> dict:
        return {"backend": "builtin", "degraded": "qmd unavailable", "hits": [
            {"source": "memory", "path": "memory/MEMORY.md", "line_start": 10, "line_end": 14,
             "session_key": None, "when": "2025-01-01", "snippet": f"about {request.query['q']}", "score": 3.5},
            {"source": "session", "path": "sessions/cli_direct.jsonl", "line_start": None, "line_end": None,
             "session_key": "cli:direct", "message_start": 3, "message_end": 8, "when": "",
             "snippet": "we talked\nabout it", "score": 1.25}]}

    async def context(self, request: Request) -> dict:
        return {"text": f"# Memory\nfor {request.query['session']}: {request.query.get('query')}",
                "tokens": 12, "budget_tokens": int(request.query.get("budget_tokens", 0)), "parts": [],
                "omitted": []}

    async def reindex(self, request: Request) -> dict:
        return {"indexed": 12}


class ServerThread:
    """A ControlServer on its own event loop in a background thread."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc_info) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def socket_path():
    base = Path(tempfile.mkdtemp(prefix="nbc-", dir="/tmp"))
    yield base / "run" / "nanobotd.sock"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon(socket_path: Path):
    fake = Daemon()
    with ServerThread(ControlServer(socket_path, fake.router)):
        yield fake


def run_ctl(socket_path: Path, *argv: str, environ: dict | None = None) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = ctl.main(["--socket", str(socket_path), *argv], environ=environ or {}, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def test_status_prints_one_block_per_workspace(socket_path: Path, daemon: Daemon) -> None:
    code, out, err = run_ctl(socket_path, "status")
    assert (code, err) == (0, "")
    assert "nanobotd 0.1.0  pid 4321  up 1h 2m 5s" in out
    assert "workspace main  (/srv/ws)" in out
    assert "workspace second  (/srv/ws2)" in out
    assert "12 messages, 3400 tokens" in out
    assert "healthy (inotify)" in out and "UNHEALTHY" in out
    assert "next 2025-01-02T04:45:00 (running)" in out
    assert "head=abc123, dirty=no" in out


def test_json_output_is_the_raw_answer(socket_path: Path, daemon: Daemon) -> None:
    for argv in (["--json", "status"], ["status", "--json"], ["sessions", "--json"], ["search", "x", "--json"],
                 ["--json", "consolidate", "cli:direct"], ["--json", "dream", "--wait"]):
        code, out, _ = run_ctl(socket_path, *argv)
        assert code == 0
        json.loads(out)
    assert json.loads(run_ctl(socket_path, "status", "--json")[1]) == STATUS


def test_sessions_prints_an_aligned_table(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "sessions")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["WORKSPACE", "KEY", "MESSAGES", "UNARCHIVED", "TOKENS", "AGENT_ARCH",
                                "DAEMON_ARCH", "CORRUPT", "UPDATED", "STATE"]
    assert lines[1].split()[:3] == ["main", "telegram:42", "120"]
    assert lines[1].index("idle") == lines[2].index("watching") == lines[0].index("STATE")
    assert lines[1].index("120") + 3 == lines[2].index("5") + 1  # numbers right-aligned


def test_a_session_key_with_slash_and_colon_round_trips(socket_path: Path, daemon: Daemon) -> None:
    key = "slack:C042/thread:1700000000.1234 x"
    code, out, _ = run_ctl(socket_path, "session", key)
    assert code == 0
    assert daemon.requests[-1].params["key"] == key
    assert f"key:      {key}" in out
    assert "last_run:" in out and "  run_id: r7" in out


def test_a_daemon_error_exits_1_with_its_message(socket_path: Path, daemon: Daemon) -> None:
    code, out, err = run_ctl(socket_path, "session", "nope")
    assert (code, out) == (1, "")
    assert err == "nanobotctl: no session 'nope' in workspace main\n"


def test_no_daemon_exits_2_with_a_hint_how_to_start_it(socket_path: Path) -> None:
    code, out, err = run_ctl(socket_path, "status")
    assert (code, out) == (2, "")
    assert f"cannot connect to nanobotd at {socket_path}" in err
    assert "nanobotd run --workspace DIR" in err
    assert "systemctl --user start nanobotd" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_a_socket_of_another_user_gets_a_permission_hint(socket_path: Path, daemon: Daemon) -> None:
    os.chmod(socket_path.parent.parent, 0o711)  # the daemon's 0700 directory is what refuses uid 65534
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reader)
            os.setgid(65534)
            os.setuid(65534)
            code, _, err = run_ctl(socket_path, "status")
            os.write(writer, f"{code}\n{err}".encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        code, _, err = pipe.read().partition("\n")
    os.waitpid(pid, 0)
    assert code == "2"
    assert "Permission denied" in err
    assert "runs as another user" in err


def test_the_socket_comes_from_env_then_config_then_the_default(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[daemon]\nsocket = "/run/custom/nb.sock"\n')
    parse = ctl.build_parser().parse_args
    environ = {"NANOBOTD_SOCKET": "/tmp/env.sock", "XDG_RUNTIME_DIR": "/run/user/1000", "HOME": str(tmp_path)}
    assert client.resolve_socket(parse(["--socket", "/tmp/a.sock", "status"]), environ) == Path("/tmp/a.sock")
    assert client.resolve_socket(parse(["status"]), environ) == Path("/tmp/env.sock")
    del environ["NANOBOTD_SOCKET"]
    assert client.resolve_socket(parse(["--config", str(config), "status"]), environ) == Path("/run/custom/nb.sock")
    assert client.resolve_socket(parse(["status"]), environ) == Path("/run/user/1000/nanobotd/nanobotd.sock")


def test_a_missing_config_file_is_reported(tmp_path: Path) -> None:
    stderr = io.StringIO()
    code = ctl.main(["--config", str(tmp_path / "none.toml"), "status"], environ={}, stdout=io.StringIO(),
                    stderr=stderr)
    assert code == 2
    assert "none.toml not found" in stderr.getvalue()


def test_runs_sends_filters_and_prints_a_table(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "runs", "--kind", "flush", "--limit", "5")
    assert code == 0
    assert daemon.requests[-1].query == {"kind": "flush", "limit": "5"}
    assert out.splitlines()[0].split()[:3] == ["RUN_ID", "KIND", "WORKSPACE"]
    assert "r1" in out and "flush" in out
    run_ctl(socket_path, "runs")
    assert daemon.requests[-1].query == {}


def test_run_prints_fields_then_the_manifest(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "run", "r-5")
    assert code == 0
    fields, _, manifest = out.partition("manifest:\n")
    assert "run_id: r-5" in fields
    assert json.loads(manifest) == {"files": ["memory/history.jsonl"], "cursor": [10, 12]}


def test_consolidate_queues_a_run_and_wait_polls_until_it_ends(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "consolidate", "cli:direct")
    assert (code, out) == (0, "queued run run-cli:direct\n")
    assert daemon.requests[-1].body == {"session": "cli:direct"}
    daemon.run_states["run-cli:direct"] = ["queued", "started", "done"]
    started = time.monotonic()
    code, out, _ = run_ctl(socket_path, "consolidate", "cli:direct", "--wait")
    assert code == 0
    assert "state:  done" in out
    assert time.monotonic() - started >= 2 * jobs.POLL_SECONDS
    assert [request.path for request in daemon.requests[-3:]] == ["/v1/runs/run-cli%3Adirect"] * 3


def test_a_failed_run_after_wait_exits_1(socket_path: Path, daemon: Daemon) -> None:
    daemon.run_states["run-s"] = ["started", "failed"]
    code, out, _ = run_ctl(socket_path, "flush", "s", "--wait")
    assert code == 1
    assert "state:  failed" in out


def test_dream_handles_several_run_ids(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "dream", "--now")
    assert (code, out) == (0, "queued run d-main\nqueued run d-second\n")
    assert daemon.requests[-1].body == {"now": True}
    code, out, _ = run_ctl(socket_path, "--json", "dream", "--wait")
    assert [run["run_id"] for run in json.loads(out)["runs"]] == ["d-main", "d-second"]


def test_workspace_is_sent_as_query_or_body_param(socket_path: Path, daemon: Daemon) -> None:
    run_ctl(socket_path, "--workspace", "second", "sessions")
    assert daemon.requests[-1].query == {"workspace": "second"}
    run_ctl(socket_path, "dream", "--workspace", "second")
    assert daemon.requests[-1].body == {"now": False, "workspace": "second"}


def test_dream_log_prints_message_then_diff(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "dream-log", "r9")
    assert code == 0
    assert daemon.requests[-1].query == {"target": "r9"}
    assert out.index("    dream: tidy USER.md") < out.index("+new")
    run_ctl(socket_path, "dream-log")
    assert daemon.requests[-1].query == {}


def test_restore_dry_run_prints_the_plan(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "restore", "r9", "--dry-run")
    assert (code, out) == (0, "revert r9\nrestore memory/MEMORY.md\n")
    assert daemon.requests[-1].body == {"target": "r9", "dry_run": True, "force": False}
    code, out, _ = run_ctl(socket_path, "restore", "r9", "--force")
    assert (code, out) == (0, "queued run restore-1\n")


def test_lifecycle_audit_observe_and_reindex(socket_path: Path, daemon: Daemon) -> None:
    assert run_ctl(socket_path, "lifecycle", "--dry-run")[1] == "move memory/2024-12-01.md to memory/archive/\n"
    assert run_ctl(socket_path, "lifecycle", "--now")[1] == "queued run life-1\n"
    code, out, _ = run_ctl(socket_path, "audit")
    assert code == 0
    assert "- USER.md missing" in out and "fix: create USER.md" in out and "dream_cursor: 40" in out
    code, out, _ = run_ctl(socket_path, "observe", "--since", "30d")
    assert daemon.requests[-1].query == {"since": "30d"}
    assert "12345" in out and "P95_MS" in out
    assert run_ctl(socket_path, "reindex")[1] == "indexed: 12\n"


def test_search_prints_numbered_hits_with_locations(socket_path: Path, daemon: Daemon) -> None:
    code, out, err = run_ctl(socket_path, "search", "tea & biscuits", "--limit", "5", "--mode", "query")
    assert code == 0
    assert daemon.requests[-1].query == {"q": "tea & biscuits", "limit": "5", "mode": "query"}
    assert "1. memory/MEMORY.md:L10-14  2025-01-01  [memory, score 3.500]" in out
    assert "   about tea & biscuits" in out
    assert "2. session cli:direct #3-8" in out
    assert "   about it" in out
    assert "degraded: qmd unavailable" in err


def test_context_prints_the_text(socket_path: Path, daemon: Daemon) -> None:
    code, out, _ = run_ctl(socket_path, "context", "cli:direct", "--query", "tea", "--budget", "2000")
    assert (code, out) == (0, "# Memory\nfor cli:direct: tea\n")
    assert daemon.requests[-1].query == {"session": "cli:direct", "query": "tea", "budget_tokens": "2000"}
    assert json.loads(run_ctl(socket_path, "--json", "context", "k", "--budget", "9")[1])["budget_tokens"] == 9


def test_a_closed_stdout_ends_quietly(socket_path: Path, daemon: Daemon) -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError()

    stderr = io.StringIO()
    code = ctl.main(["--socket", str(socket_path), "sessions"], environ={}, stdout=ClosedPipe(), stderr=stderr)
    assert code == invocation.EXIT_BROKEN_PIPE
    assert stderr.getvalue() == ""


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert ctl.main(["frobnicate"], environ={}) == 2
    assert ctl.main(["--version"], environ={}) == 0
    assert "nanobotctl 0.1.0" in capsys.readouterr().out


def test_format_table_aligns_columns_and_marks_missing_values() -> None:
    lines = render.format_table(["NAME", "COUNT", "OK"], [["a", 5, True], ["longer", 12345, None]])
    assert lines == ["NAME    COUNT  OK", "a           5  yes", "longer  12345  -"]


def subprocess_env(socket_path: Path) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NANOBOTD_SOCKET": str(socket_path),
            "HOME": str(socket_path.parent), "XDG_CONFIG_HOME": str(socket_path.parent)}


def test_nanobotctl_status_as_a_subprocess(socket_path: Path, daemon: Daemon) -> None:
    result = subprocess.run([str(NANOBOTCTL), "status"], capture_output=True, text=True, timeout=30,
                            env=subprocess_env(socket_path))
    assert result.returncode == 0, result.stderr
    assert "workspace main" in result.stdout
    failed = subprocess.run([str(NANOBOTCTL), "--socket", str(socket_path) + ".none", "status"],
                            capture_output=True, text=True, timeout=30, env=subprocess_env(socket_path))
    assert failed.returncode == 2
    assert "nanobotd run --workspace DIR" in failed.stderr


def test_nanobotctl_status_imports_only_the_standard_library(socket_path: Path, daemon: Daemon) -> None:
    script = (
        "import sys; before = set(sys.modules)\n"
        "from nanobotd.cli import nanobotctl as ctl\n"
        "code = ctl.main(['status'])\n"
        "print('MODULES', ' '.join(sorted(set(sys.modules) - before)))\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                            env=subprocess_env(socket_path))
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split("MODULES ", 1)[1].split()
    foreign = [name for name in loaded
               if name.split(".")[0] not in sys.stdlib_module_names and name not in ALLOWED_OWN_MODULES]
    assert foreign == []

    timed = subprocess.run([sys.executable, "-X", "importtime", str(NANOBOTCTL), "status"], capture_output=True,
                           text=True, timeout=30, env=subprocess_env(socket_path))
    imported = {line.rsplit("|", 1)[-1].strip() for line in timed.stderr.splitlines() if line.startswith("import time")}
    assert "nanobotd.cli.nanobotctl" in imported
    assert [name for name in imported if name.startswith(HEAVY_MODULES)] == []


def test_nanobotctl_status_answers_quickly(socket_path: Path, daemon: Daemon) -> None:
    durations = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([str(NANOBOTCTL), "status"], capture_output=True, timeout=30, check=True,
                       env=subprocess_env(socket_path))
        durations.append(time.perf_counter() - started)
    # The target is well under 200 ms; the bound leaves room for a loaded CI machine.
    assert statistics.median(durations) < 0.5
