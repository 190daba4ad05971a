"""Control API handlers: the daemon's state and operations as HTTP/JSON endpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanobotd import __version__
from nanobotd.api.router import ApiError, Request, Response, Router
from nanobotd.daemon.control_upkeep import add_upkeep_routes

if TYPE_CHECKING:
    from nanobotd.daemon.daemon import Daemon

MAX_RUNS_LIMIT = 1000


def build_router(daemon: "Daemon") -> Router:
    """Every endpoint of the control API."""
    handlers = ControlHandlers(daemon)
    router = Router()
    routes = [
        ("GET", "/v1/status", handlers.status),
        ("GET", "/v1/sessions", handlers.sessions),
        ("GET", "/v1/sessions/{key}", handlers.session),
        ("GET", "/v1/runs", handlers.runs),
        ("GET", "/v1/runs/{run_id}", handlers.run),
        ("POST", "/v1/consolidate", handlers.consolidate),
        ("POST", "/v1/flush", handlers.flush),
    ]
    for method, pattern, handler in routes:
        router.add(method, pattern, handler)
    add_upkeep_routes(router, daemon)
    return router


class ControlHandlers:
    """Handlers for the session, run and status endpoints."""

    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon
        self.services = daemon.services

    def _runtime(self, request: Request):
        try:
            return self.services.runtime(request.query.get("workspace") or request.json_object().get("workspace"))
        except KeyError as exc:
            raise ApiError(404, "unknown_workspace", str(exc.args[0])) from None

    async def status(self, request: Request) -> dict:
        workspaces = []
        for runtime in self.daemon.runtimes.values():
            data = runtime.status()
            watcher = self.daemon.watcher
            folders = [str(folder) for folder in runtime.sessions_dirs]
            data["watcher"] = {
                "healthy": bool(watcher and watcher.healthy() and all(f in watcher.health()["folders"] for f in folders)),
                "mode": watcher.mode if watcher else None,
                "last_reconcile": data["last_reconcile"],
                "waiting_for": None if runtime.sessions_dirs else str(runtime.settings.path),
            }
            data.update(self.services.upkeep.workspace_status(runtime))
            workspaces.append(data)
        queue = self.daemon.queue
        return {
            "version": __version__, "pid": self.daemon.pid, "uptime_seconds": round(self.daemon.uptime, 1),
            "socket": str(self.daemon.config.socket_path), "state_dir": str(self.daemon.config.state_dir),
            "jobs_running": queue.running_kinds() if queue else [],
            "workspaces": workspaces,
        }

    async def sessions(self, request: Request) -> dict:
        rows = []
        name = request.query.get("workspace")
        for runtime in self.daemon.runtimes.values():
            if name and name != runtime.name:
                continue
            for session in runtime.tracker.sessions.values():
                rows.append(dict(session.to_json(), workspace=runtime.name,
                                 daemon_archived=self._daemon_archived(session.session_id)))
        rows.sort(key=lambda row: (row["workspace"], row["key"]))
        return {"sessions": rows}

    def _daemon_archived(self, session_id: int) -> int:
        return self.daemon.store.query("SELECT count(*) FROM archived WHERE session_id=?", (session_id,))[0][0]

    async def session(self, request: Request) -> dict:
        key = request.params["key"]
        try:
            runtime = self.services.find_session(key, request.query.get("workspace"))
        except KeyError as exc:
            raise ApiError(404, "unknown_session", str(exc.args[0])) from None
        session = runtime.tracker.sessions[key]
        data = dict(session.to_json(), workspace=runtime.name, daemon_archived=self._daemon_archived(session.session_id))
        data["budget"] = runtime.settings.budget
        data["flush_threshold"] = runtime.settings.flush_threshold
        data["target_after_consolidation"] = int(runtime.settings.budget * runtime.settings.consolidation.ratio)
        data["vanished_messages"] = len(runtime.tracker.pending(key, vanished_only=True))
        runs = [run for run in self.daemon.store.list_runs(workspace=runtime.name, limit=200)
                if run.session_key == key]
        data["last_run"] = runs[0].to_json(with_manifest=False) if runs else None
        return {"session": data}

    async def runs(self, request: Request) -> dict:
        limit = request.query_int("limit", 50, minimum=1)
        runs = self.daemon.store.list_runs(kind=request.query.get("kind") or None,
                                           workspace=request.query.get("workspace") or None,
                                           limit=min(limit, MAX_RUNS_LIMIT))
        return {"runs": [run.to_json(with_manifest=False) for run in runs]}

    async def run(self, request: Request) -> dict:
        run = self.daemon.store.get_run(request.params["run_id"])
        if run is None:
            raise ApiError(404, "unknown_run", f"no run {request.params['run_id']!r}")
        return {"run": run.to_json()}

    def _session_job(self, request: Request):
        body = request.json_object()
        key = body.get("session")
        if not isinstance(key, str) or not key:
            raise ApiError(400, "bad_request", "body needs \"session\": the session key")
        try:
            return self.services.find_session(key, body.get("workspace")), key
        except KeyError as exc:
            raise ApiError(404, "unknown_session", str(exc.args[0])) from None

    async def consolidate(self, request: Request) -> Response:
        runtime, key = self._session_job(request)
        run_id = self.services.submit_consolidate(runtime, key, reason="manual")
        return Response(202, {"run_id": run_id, "status_url": f"/v1/runs/{run_id}"})

    async def flush(self, request: Request) -> Response:
        runtime, key = self._session_job(request)
        if runtime.llm.offline:
            raise ApiError(409, "offline", "the memory flush needs an LLM; this workspace runs in offline mode")
        run_id = self.services.submit_flush(runtime, key)
        return Response(202, {"run_id": run_id, "status_url": f"/v1/runs/{run_id}"})
