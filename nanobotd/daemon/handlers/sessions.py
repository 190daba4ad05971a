"""Sessions and runs: what nanobotd tracks, and the run ledger."""

from __future__ import annotations

from nanobotd.api.app import ApiError, Request
from nanobotd.daemon import runview
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import named_workspaces, session_workspace
from nanobotd.tuning import MAX_RUN_WAIT_MS

MAX_RUNS_LIMIT = 1000
TRUE_VALUES = ("1", "true", "yes")


async def sessions(core: Core, request: Request) -> dict:
    """Every tracked session, read from the tracker's snapshot (a scan running meanwhile replaces it)."""
    rows = []
    scanning = []
    archived = dict(core.store.query("SELECT session_id, count(*) FROM archived GROUP BY session_id"))
    for workspace in named_workspaces(core, request):
        if workspace.last_reconcile is None:
            scanning.append(workspace.name)
        for session in workspace.tracker.sessions.values():
            if not session.skipped:
                rows.append(dict(session.to_json(), workspace=workspace.name,
                                 daemon_archived=archived.get(session.session_id, 0)))
    rows.sort(key=lambda row: (row["workspace"], row["key"]))
    return {"sessions": rows, "scanning": scanning}


async def session(core: Core, request: Request) -> dict:
    """One session with its budgets, what is vanished and its last run."""
    key = request.params["key"]
    workspace = session_workspace(core, key, request.query.get("workspace"))
    settings = workspace.settings
    session = workspace.tracker.sessions[key]
    archived = core.store.query("SELECT count(*) FROM archived WHERE session_id=?", (session.session_id,))[0][0]
    data = dict(session.to_json(), workspace=workspace.name, daemon_archived=archived)
    data.update(workspace.budgets())
    if workspace.mode == "companion":
        data["agent_prompt_tokens"] = workspace.agent_prompt_tokens(key)
    else:  # beside a companion agent, the agent decides what its compaction keeps
        data["target_after_consolidation"] = int(settings.budget * settings.consolidation.ratio)
    data["vanished_messages"] = len(workspace.tracker.pending(key, vanished_only=True))
    runs = [run for run in core.store.list_runs(workspace=workspace.name, limit=200)
            if run.session_key == key]
    data["last_run"] = runs[0].to_json(with_manifest=False) if runs else None
    return {"session": data}


async def runs(core: Core, request: Request) -> dict:
    """Newest first; runs that changed nothing are left out (and counted) unless all=true."""
    limit = request.query_int("limit", 50, minimum=1)
    kind = request.query.get("kind") or None
    workspace = named_workspaces(core, request)[0].name if request.query.get("workspace") else None
    everything = request.query.get("all", "").lower() in TRUE_VALUES
    runs = core.store.list_runs(kind=kind, workspace=workspace, limit=min(limit, MAX_RUNS_LIMIT),
                                     unchanged=everything)
    hidden = 0 if everything else core.store.count_unchanged_runs(kind=kind, workspace=workspace)
    return {"runs": [run.to_json(with_manifest=False) for run in runs], "hidden_unchanged": hidden}


async def run(core: Core, request: Request) -> dict:
    """One run with its manifest, what it changed and, while open, how far it has got. With wait_ms the answer waits for
    the run's end up to that long, so a waiting nanobotctl hears of it at once without polling faster."""
    wait_ms = request.query_int("wait_ms", 0, minimum=0, maximum=MAX_RUN_WAIT_MS)
    if wait_ms and core.queue is not None:
        await core.queue.wait_ended(request.params["run_id"], wait_ms / 1000)
    run = core.store.get_run(request.params["run_id"])
    if run is None:
        raise ApiError(404, "unknown_run", f"no run {request.params['run_id']!r}")
    phase = core.queue.phase(run.run_id) if core.queue else None
    return {"run": runview.run_json(run, phase=phase, now=core.clock())}


ROUTES = [  # Read-only views of the tracker and the ledger.
    ("GET", "/v1/sessions", sessions),
    ("GET", "/v1/sessions/{key:path}", session),
    ("GET", "/v1/runs", runs),
    ("GET", "/v1/runs/{run_id}", run),
]
