"""Memory jobs on demand: consolidate, flush, dream, lifecycle, restore, reindex, and what a dream changed."""

from __future__ import annotations

from nanobotd.api.app import ApiError, Request, Response
from nanobotd.daemon import runs, triggers
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import named_workspaces, one_workspace, session_workspace, started
from nanobotd.daemon.workspace import Workspace
from nanobotd.jobs import lifecycle, restore
from nanobotd.jobs.dream.restore import dream_log


def routes(core: Core) -> list:
    """The memory-job endpoints."""
    handlers = MemoryHandlers(core)
    return [
        ("POST", "/v1/consolidate", handlers.consolidate),
        ("POST", "/v1/flush", handlers.flush),
        ("POST", "/v1/dream", handlers.dream),
        ("GET", "/v1/dream-log", handlers.dream_log),
        ("POST", "/v1/restore", handlers.restore),
        ("POST", "/v1/lifecycle", handlers.lifecycle),
        ("POST", "/v1/reindex", handlers.reindex),
    ]


class MemoryHandlers:
    """Each handler resolves its workspace (named, or the only one) and starts a run."""

    def __init__(self, core: Core):
        self.core = core

    def _session_job(self, request: Request) -> tuple[Workspace, str]:
        body = request.json_object()
        key = body.get("session")
        if not isinstance(key, str) or not key:
            raise ApiError(400, "bad_request", "body needs \"session\": the session key")
        return session_workspace(self.core, key, body.get("workspace")), key

    async def consolidate(self, request: Request) -> Response:
        """Archive everything unarchived now (what the agent's own archive left, beside an agent).

        The answer says whether the run was already queued (joined) and in which mode, so the caller can
        tell what is left afterwards.
        """
        workspace, key = self._session_job(request)
        waiting = runs.joinable(self.core, workspace, "consolidate", session_key=key, reason="manual")
        run_id = triggers.submit_consolidate(self.core, workspace, key, reason="manual")
        answer = started([run_id])
        answer.body.update(joined=waiting == run_id, session=key, workspace=workspace.name,
                           consolidation_mode=workspace.mode)
        return answer

    async def flush(self, request: Request) -> Response:
        workspace, key = self._session_job(request)
        if workspace.llm.offline:
            raise ApiError(409, "offline", "the memory flush needs an LLM; this workspace runs in offline mode")
        return started([runs.submit(self.core, workspace, "flush", session_key=key)])

    async def dream(self, request: Request) -> Response:
        body = request.json_object()
        run_ids = []
        for workspace in named_workspaces(self.core, request, body):
            if workspace.llm.offline:
                if len(self.core.workspaces) == 1 or body.get("workspace"):
                    raise ApiError(409, "offline", "dream needs an LLM; this workspace runs in offline mode")
                continue
            run_ids.append(runs.submit(self.core, workspace, "dream"))
        return started(run_ids)

    async def dream_log(self, request: Request) -> dict:
        workspace = one_workspace(self.core, request)
        git = workspace.git
        target = request.query.get("target") or None
        if target and (run := self.core.store.get_run(target)) is not None and run.manifest.get("commit"):
            target = run.manifest["commit"]
        try:
            return {"commit": await git.call(dream_log, git, target)}
        except Exception as exc:
            raise ApiError(404, "no_commit", str(exc)) from None

    async def restore(self, request: Request):
        body = request.json_object()
        target = request.body_value("target", str)
        force = bool(body.get("force", False))
        workspace = self._restore_workspace(target, body, request)
        if body.get("dry_run"):
            try:
                result = await restore.plan(workspace.env, target, force=force)
            except restore.REFUSALS as exc:
                raise ApiError(409, "cannot_restore", str(exc)) from None
            return {"plan": result.get("plan", []), "kind": result.get("kind")}
        try:
            await restore.validate(workspace.env, target)
        except restore.UnknownRun as exc:
            raise ApiError(404, "cannot_restore", str(exc)) from None
        except restore.RestoreError as exc:
            raise ApiError(409, "cannot_restore", str(exc)) from None
        run_ids: list[str] = []  # the messages a restore un-archives are archived again when their time comes
        run_ids.append(runs.submit(self.core, workspace, "restore", target=target, force=force,
                                   on_done=lambda: triggers.restored(self.core, workspace, run_ids[0])))
        return started(run_ids)

    def _restore_workspace(self, target: str, body: dict, request: Request) -> Workspace:
        run = self.core.store.get_run(target)
        if run is not None and not body.get("workspace") and run.workspace in self.core.workspaces:
            return self.core.workspaces[run.workspace]
        return one_workspace(self.core, request, body)

    async def reindex(self, request: Request) -> Response:
        """Rebuild the search indexes of the named workspace (or all) as runs the caller can follow."""
        body = request.json_object()
        return started([runs.submit_reindex(self.core, workspace)
                        for workspace in named_workspaces(self.core, request, body)])

    async def lifecycle(self, request: Request):
        body = request.json_object()
        workspaces = named_workspaces(self.core, request, body)
        if body.get("dry_run"):
            plans = []
            for workspace in workspaces:
                result = await lifecycle.plan(workspace.env)
                plans.extend(f"[{workspace.name}] {line}" for line in plan_lines(result))
            return {"plan": plans}
        return started([runs.submit(self.core, workspace, "lifecycle") for workspace in workspaces])


def plan_lines(result: dict) -> list[str]:
    """A lifecycle plan as lines for people, with the files it leaves alone."""
    lines = [step if isinstance(step, str) else lifecycle.describe_step(step) for step in result.get("plan", [])]
    lines.extend(f"skip {skipped.get('path')}: {skipped.get('reason')}" for skipped in result.get("skipped", []))
    return lines or ["nothing to do"]
