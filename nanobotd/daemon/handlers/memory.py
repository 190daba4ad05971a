"""Memory jobs on demand: consolidate, flush, dream, lifecycle, restore, reindex, and what a dream changed. Each handler
resolves its workspace (named, or the only one) and starts a run."""

from __future__ import annotations

from nanobotd.api.app import ApiError, Request, Response
from nanobotd.daemon import runs, triggers
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import git_opened, named_workspaces, one_workspace, session_workspace, started
from nanobotd.daemon.workspace import Workspace
from nanobotd.jobs import lifecycle, restore
from nanobotd.jobs.dream.restore import dream_log


def session_job(core: Core, request: Request) -> tuple[Workspace, str]:
    """The workspace and session key a session job's body names; 400 without a key."""
    body = request.json_object()
    key = body.get("session")
    if not isinstance(key, str) or not key:
        raise ApiError(400, "bad_request", "body needs \"session\": the session key")
    workspace = session_workspace(core, key, body.get("workspace"))
    if workspace.held_elsewhere:  # its first scan never comes while another daemon holds it: a run would wait for it
        raise ApiError(409, "held_elsewhere", f"workspace {workspace.name} is left alone: {workspace.held_elsewhere}")
    return workspace, key


async def consolidate(core: Core, request: Request) -> Response:
    """Archive everything unarchived now (beside an agent: what its own archive left). The answer says whether the run
    was joined and in which mode, so the caller can tell what is left afterwards."""
    workspace, key = session_job(core, request)
    waiting = runs.joinable(core, workspace, "consolidate", session_key=key, reason="manual")
    answer = started([triggers.submit_consolidate(core, workspace, key, reason="manual")])
    answer.body.update(joined=waiting == answer.body["run_id"], session=key, workspace=workspace.name,
                       consolidation_mode=workspace.mode)
    return answer


async def flush(core: Core, request: Request) -> Response:
    """Save the session's facts to today's daily note (needs an LLM)."""
    workspace, key = session_job(core, request)
    if workspace.llm.offline:
        raise ApiError(409, "offline", "the memory flush needs an LLM; this workspace runs in offline mode")
    return started([runs.submit(core, workspace, "flush", session_key=key)])


async def dream(core: Core, request: Request) -> Response:
    """Dream in the named workspace (else every one with an LLM)."""
    body = request.json_object()
    run_ids = []
    for workspace in named_workspaces(core, request, body):
        if workspace.llm.offline:
            if len(core.workspaces) == 1 or body.get("workspace"):
                raise ApiError(409, "offline", "dream needs an LLM; this workspace runs in offline mode")
            continue
        run_ids.append(runs.submit(core, workspace, "dream"))
    return started(run_ids)


async def show_dream(core: Core, request: Request) -> dict:
    """A dream commit (by run id or sha, default the newest) with its diff, once the git store is open."""
    workspace = one_workspace(core, request)
    await git_opened(workspace)
    target = request.query.get("target") or None
    if target and (run := core.store.get_run(target)) is not None and run.manifest.get("commit"):
        target = run.manifest["commit"]
    try:
        return {"commit": await workspace.git.call(dream_log, workspace.git, target)}
    except Exception as exc:
        raise ApiError(404, "no_commit", str(exc)) from None


async def restore_run(core: Core, request: Request) -> Response | dict:
    """Undo a run as a new run (or, with dry_run, only say what that would do), once the git store is open."""
    body = request.json_object()
    target = request.body_value("target", str)
    force = bool(body.get("force", False))
    run = core.store.get_run(target)
    if run is not None and not body.get("workspace") and run.workspace in core.workspaces:
        workspace = core.workspaces[run.workspace]
    else:
        workspace = one_workspace(core, request, body)
    await git_opened(workspace)
    if body.get("dry_run"):
        try:
            result = await restore.plan(workspace.env, target, force=force)
        except restore.REFUSALS as exc:
            raise ApiError(409, "cannot_restore", str(exc)) from None
        return {"plan": result.get("plan", []), "kind": result.get("kind")}
    try:
        await restore.validate(workspace.env, target)
    except restore.RestoreError as exc:
        raise ApiError(404 if isinstance(exc, restore.UnknownRun) else 409, "cannot_restore", str(exc)) from None
    run_ids: list[str] = []  # the messages a restore un-archives are archived again when their time comes
    run_ids.append(runs.submit(core, workspace, "restore", target=target, force=force,
                               on_done=lambda: triggers.restored(core, workspace, run_ids[0])))
    return started(run_ids)


async def reindex(core: Core, request: Request) -> Response:
    """Rebuild the search indexes of the named workspace (or all) as runs the caller can follow (a reindex already
    under way is joined)."""
    body = request.json_object()
    return started([runs.submit(core, workspace, "reindex") for workspace in named_workspaces(core, request, body)])


async def lifecycle_run(core: Core, request: Request) -> Response | dict:
    """Archive old daily notes and prune old backups (or, with dry_run, list what that would do)."""
    body = request.json_object()
    workspaces = named_workspaces(core, request, body)
    if body.get("dry_run"):
        plans = []
        for workspace in workspaces:
            result = await lifecycle.plan(workspace.env)
            plans.extend(f"[{workspace.name}] {line}" for line in plan_lines(result))
        return {"plan": plans}
    return started([runs.submit(core, workspace, "lifecycle") for workspace in workspaces])


def plan_lines(result: dict) -> list[str]:
    """A lifecycle plan as lines for people, with the files it leaves alone."""
    lines = [step if isinstance(step, str) else lifecycle.describe_step(step) for step in result.get("plan", [])]
    lines.extend(f"skip {skipped.get('path')}: {skipped.get('reason')}" for skipped in result.get("skipped", []))
    return lines or ["nothing to do"]


ROUTES = [
    ("POST", "/v1/consolidate", consolidate),
    ("POST", "/v1/flush", flush),
    ("POST", "/v1/dream", dream),
    ("GET", "/v1/dream-log", show_dream),
    ("POST", "/v1/restore", restore_run),
    ("POST", "/v1/lifecycle", lifecycle_run),
    ("POST", "/v1/reindex", reindex),
]
