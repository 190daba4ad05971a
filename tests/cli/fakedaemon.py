"""A real ControlServer with canned handlers for nanobotctl to talk to, and helpers to run nanobotctl."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
from pathlib import Path

from nanobotd.api.app import ApiError, Request, Response
from nanobotd.api.server import ControlServer
from nanobotd.cli import nanobotctl

NANOBOTCTL = Path(sys.executable).with_name("nanobotctl")
REPO = Path(__file__).resolve().parents[2]

STATUS = {
    "version": "0.1.0", "pid": 4321, "uptime_seconds": 3725,
    "workspaces": [
        {"name": "main", "path": "/srv/ws", "sessions_dir": "/srv/ws/sessions", "sessions_watched": 3,
         "unarchived_messages": 12, "unarchived_tokens": 3400,
         "watcher": {"healthy": True, "mode": "inotify", "last_reconcile": "2025-01-01T10:00:00"},
         "llm_mode": "openai/gpt-4o-mini",
         "git": {"available": True, "reason": None, "head": "abc123def4567890", "dirty_tracked_files": []},
         "jobs": {"dream": {"last_success": "2025-01-01T04:15:00", "next_run": "2025-01-02T04:15:00",
                            "running": False},
                  "lifecycle": {"last_success": None, "next_run": "2025-01-02T04:45:00", "running": True}},
         "search": {"backend": "builtin",
                    "builtin": {"units": 185, "files": 8, "last_refresh": "2025-01-01T10:00:01", "db_bytes": 457328},
                    "last_refresh": {"files_checked": 8, "files_reindexed": 2, "units_added": 20, "units_removed": 3,
                                     "seconds": 0.03},
                    "pending_changes": 0, "refreshing": True, "refreshes": 14, "refresh_seconds": 3.25}},
        {"name": "second", "path": "/srv/ws2", "llm_mode": "offline", "watcher": {"healthy": False},
         "jobs": {"dream": {"off": "the dream needs an LLM", "last_success": None, "next_run": None,
                            "running": False}}},
    ],
}


class FakeDaemon:
    """Canned control API handlers recording what the CLI sent."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.run_states: dict[str, list[str]] = {}
        self.router = [(method, path, self.recorded(handler)) for method, path, handler in (
            ("GET", "/v1/status", self.status), ("GET", "/v1/sessions", self.sessions),
            ("GET", "/v1/sessions/{key:path}", self.session), ("GET", "/v1/runs", self.runs),
            ("GET", "/v1/runs/{run_id}", self.run), ("POST", "/v1/consolidate", self.queue),
            ("POST", "/v1/flush", self.queue), ("POST", "/v1/dream", self.dream),
            ("GET", "/v1/dream-log", self.dream_log), ("POST", "/v1/restore", self.restore),
            ("POST", "/v1/lifecycle", self.lifecycle), ("GET", "/v1/audit", self.audit),
            ("GET", "/v1/metrics", self.metrics), ("GET", "/v1/search", self.search),
            ("GET", "/v1/context", self.context), ("POST", "/v1/reindex", self.reindex),
        )]

    def recorded(self, handler):
        """Wrap *handler* so each request is kept in self.requests for the test to inspect."""
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
                            "unarchived_messages": 4, "unarchived_tokens": 120,
                            "last_run": {"run_id": "r7", "state": "done"}}}

    async def runs(self, request: Request) -> dict:
        return {"runs": [{"run_id": "r1", "kind": request.query.get("kind", "dream"), "workspace": "main",
                          "session_key": None, "state": "finished", "outcome": "written",
                          "started_at": "2025-01-01T04:15:00", "finished_at": "2025-01-01T04:16:00"}],
                "hidden_unchanged": 0 if request.query.get("all") else 3, "query": request.query}

    async def run(self, request: Request) -> dict:
        run_id = request.params["run_id"]
        if run_id == "nope":
            raise ApiError(404, "unknown_run", "no run 'nope'")
        states = self.run_states.get(run_id) or ["finished"]
        state = states.pop(0) if len(states) > 1 else states[0]
        run = {"run_id": run_id, "kind": "consolidate", "workspace": "main", "session_key": "cli:direct",
               "state": state, "outcome": {"finished": "summarized", "failed": "error"}.get(state),
               "started_at": "2025-01-01T10:00:00", "finished_at": None, "duration_seconds": None,
               "progress": None, "changes": {"files": [], "commits": []},
               "manifest": {"chunks": [{"count": 30, "tokens": 900, "outcome": "summarized", "cursors": [10, 11]}],
                            "cursors": [10, 11], "removed_transcript": "x" * 2000}}
        if state in ("queued", "started"):
            run["progress"] = {"phase": "running" if state == "started" else "queued", "step": "archiving",
                               "done": 1, "total": 3, "elapsed_seconds": 2.0}
        else:
            run.update(finished_at="2025-01-01T10:00:02", duration_seconds=2.25,
                       changes={"entries_added": 2, "messages_archived": 30, "files": ["memory/history.jsonl"],
                                "commits": []})
        if state == "failed":
            run.update(error="LLMUnavailable: connection refused",
                       changes={"files": [], "commits": []})
        return {"run": run}

    async def queue(self, request: Request) -> Response:
        session = request.body_value("session", str)
        return Response(202, {"run_id": f"run-{session}", "session": session, "joined": session == "joined",
                              "consolidation_mode": "companion" if session == "agent" else "owner"})

    async def dream(self, request: Request) -> Response:
        return Response(202, {"run_ids": ["d-main", "d-second"]})

    async def dream_log(self, request: Request) -> dict:
        return {"commit": {"sha": "abc123", "message": "dream: tidy USER.md\n\nNanobot-Run: r9\n",
                           "author": "nanobotd", "date": "2025-01-01T04:16:00",
                           "diff": "--- a/USER.md\n+++ b/USER.md\n@@ -1 +1 @@\n-old\n+new\n"}}

    async def restore(self, request: Request) -> Response | dict:
        body = request.json_object()
        if body.get("dry_run"):
            return {"plan": [f"revert {body['target']}", "restore memory/MEMORY.md"], "kind": "dream"}
        return Response(202, {"run_id": "restore-1", "status_url": "/v1/runs/restore-1"})

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
             "latency_ms_p50": 800, "latency_ms_p95": 2100, "restored": 2,
             "fallback_reasons": {"LLM failed: timeout": 1}}],
            "restores": {"total": 3, "by_outcome": {"restored": 2, "refused": 1}, "by_kind": {"consolidate": 2}}}

    async def search(self, request: Request) -> dict:
        fallback = {"fallback": "vsearch needs QMD"} if request.query.get("mode") == "vsearch" else {}
        return {**fallback, "backend": "builtin", "degraded": "qmd unavailable", "hits": [
            {"source": "memory", "path": "memory/MEMORY.md", "line_start": 10, "line_end": 14,
             "session_key": None, "when": "2025-01-01", "snippet": f"about {request.query['q']}", "score": 3.5},
            {"source": "session", "path": "sessions/cli_direct.jsonl", "line_start": None, "line_end": None,
             "session_key": "cli:direct", "message_start": 3, "message_end": 8, "when": "",
             "snippet": "we talked\nabout it", "score": 1.25}]}

    async def context(self, request: Request) -> dict:
        if request.query.get("session") == "nope":
            raise ApiError(404, "unknown_session", "no session 'nope'")
        if request.query.get("budget_tokens") == "1":
            return {"text": "", "tokens": 0, "budget_tokens": 1, "parts": [], "omitted": [],
                    "warning": "the context is empty: a budget of 1 tokens fits none of SOUL.md; raise the budget"}
        return {"text": f"# Memory\nfor {request.query['session']}: {request.query.get('query')}",
                "tokens": 12, "budget_tokens": int(request.query.get("budget_tokens", 0)), "parts": [],
                "omitted": []}

    async def reindex(self, request: Request) -> Response:
        return Response(202, {"run_id": "reindex-1"})


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


def run_ctl(socket_path: Path, *argv: str, environ: dict | None = None) -> tuple[int, str, str]:
    """nanobotctl in-process against *socket_path*: exit code, stdout, stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = nanobotctl.main(["--socket", str(socket_path), *argv], environ=environ or {}, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def subprocess_env(socket_path: Path) -> dict:
    """A minimal environment in which a nanobotctl subprocess finds *socket_path* and nothing real, and
    imports the nanobotd of this checkout (not whichever one the venv was installed from)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NANOBOTD_SOCKET": str(socket_path),
            "HOME": str(socket_path.parent), "XDG_CONFIG_HOME": str(socket_path.parent), "PYTHONPATH": str(REPO)}
