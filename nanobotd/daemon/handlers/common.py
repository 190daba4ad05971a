"""What every handler does the same way: find the workspace(s) a request names, wait for its git store to open,
run blocking work on the executor, answer 202 for a run; and `bind`, which hands the core to a module's ROUTES."""

from __future__ import annotations

import asyncio
import functools

from nanobotd.api.app import ApiError, Request, Response, Routes
from nanobotd.daemon.core import Core
from nanobotd.daemon.workspace import Workspace

OPEN_WAIT_SECONDS = 10.0  # how long a request that needs the git store waits for a workspace still opening


def named_workspaces(core: Core, request: Request, body: dict | None = None) -> list[Workspace]:
    """The workspace the request names (query or body), else all of them; 404 for an unknown name."""
    name = request.query.get("workspace") or (body or {}).get("workspace")
    if name:
        try:
            return [core.workspace(name)]
        except KeyError as exc:
            raise ApiError(404, "unknown_workspace", str(exc.args[0])) from None
    return list(core.workspaces.values())


def one_workspace(core: Core, request: Request, body: dict | None = None) -> Workspace:
    """The one workspace a request is about; 400 when several are managed and none is named."""
    workspaces = named_workspaces(core, request, body)
    if len(workspaces) != 1:
        raise ApiError(400, "workspace_required", "several workspaces are managed; pass workspace=NAME")
    return workspaces[0]


async def git_opened(workspace: Workspace) -> None:
    """Wait up to OPEN_WAIT_SECONDS for the workspace's git store to open; 409 not_open when it has not."""
    opening = workspace.opening
    if opening is not None and not opening.done():
        await asyncio.wait({opening}, timeout=OPEN_WAIT_SECONDS)
    if opening is None or not opening.done():
        state = "is still opening its git store" if opening else "is not open (its folder does not exist yet)"
        raise ApiError(409, "not_open", f"workspace {workspace.name} {state}; try again shortly")


def session_workspace(core: Core, key: str, workspace_name: str | None) -> Workspace:
    """The workspace holding session *key* (the named one, else any); 404 when none does, 403 when only another does: a
    caller bound to one workspace gets neither another's memory nor a quiet answer about its own."""
    holders = [workspace for workspace in core.workspaces.values() if key in workspace.tracker.sessions]
    if not workspace_name:
        if not holders:
            raise ApiError(404, "unknown_session", f"no session {key!r}")
        return holders[0]
    try:
        named = core.workspace(workspace_name)
    except KeyError as exc:
        raise ApiError(404, "unknown_session", str(exc.args[0])) from None
    if named in holders:
        return named
    if holders:
        raise ApiError(403, "other_workspace", f"session {key!r} belongs to another workspace, not {named.name!r}; "
                                               f"this request may read only workspace {named.name!r}")
    raise ApiError(404, "unknown_session", f"no session {key!r} in workspace {named.name}")


def started(run_ids: list[str]) -> Response:
    """202 with the run id (or ids) a request started."""
    if len(run_ids) == 1:
        return Response(202, {"run_id": run_ids[0], "status_url": f"/v1/runs/{run_ids[0]}"})
    return Response(202, {"run_ids": run_ids})


def bind(core: Core, routes: Routes) -> Routes:
    """(method, pattern, handler(core, request)) routes as the server takes them: handler(request)."""
    return [(method, pattern, functools.partial(handler, core)) for method, pattern, handler in routes]


async def blocking(core: Core, function, *args):
    """*function* on the core's executor, so file reads and SQLite never stall the event loop."""
    return await asyncio.get_running_loop().run_in_executor(core.executor, function, *args)
