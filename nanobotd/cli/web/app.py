"""The web page's routes: each reads the daemon's control API over its socket and renders one template. Plain functions
(Starlette's thread pool) with nanobotctl's blocking client; no state but the guard's secrets; no JavaScript needed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from nanobotd.cli import runtext
from nanobotd.cli.client import CannotConnect, Client, DaemonError
from nanobotd.cli.render import format_location
from nanobotd.cli.web import views
from nanobotd.cli.web.guard import CSRF_FIELD, Guard, Secrets

HERE = Path(__file__).parent
HISTORY_PAGE = 50
RUNS_PAGE = 100
HEALTH_DAYS = 14
RESTORE_WAIT_MS = 10_000
RESTORE_WAIT_ROUNDS = 6  # a restore the page waits for at most a minute, then links to the run

# Memory holds whatever chats said: even if some of it got through as markup, no script but ours runs and no
# other site may frame the page (the token bars' widths are inline style attributes).
PAGE_HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                           "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
                                           "base-uri 'none'"}

ClientFactory = Callable[[str | None], Client]


class Pages:
    """One method per page; *client_for* gives a control client for a workspace name (None: the only one)."""

    def __init__(self, client_for: ClientFactory, keys: Secrets) -> None:
        self.client_for = client_for
        self.keys = keys
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
        self.templates.filters["markdown"] = views.markdown_renderer()
        self.templates.globals.update(location=format_location, csrf_field=CSRF_FIELD)

    def render(self, request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        page = self.templates.get_template(name).render(request=request, csrf=self.keys.csrf, **context)
        return HTMLResponse(page, status_code=code, headers=PAGE_HEADERS)

    def _frame(self, request: Request) -> tuple[Client, dict, dict]:
        """The client, the daemon's status and the chosen workspace's part of it."""
        status = self.client_for(None).get("/v1/status")
        names = [workspace["name"] for workspace in status.get("workspaces") or []]
        chosen = request.query_params.get("workspace")
        if chosen not in names:
            chosen = names[0] if names else None
        workspace = next((item for item in status.get("workspaces") or [] if item["name"] == chosen), {})
        return self.client_for(chosen), status, workspace

    def overview(self, request: Request) -> Response:
        _, status, _ = self._frame(request)
        # every workspace's sessions (the one-workspace client would give only the chosen one's)
        sessions = self.client_for(None).get("/v1/sessions") if status.get("workspaces") else {"sessions": []}
        panels = []
        for workspace in status.get("workspaces") or []:
            daily = self.client_for(workspace["name"]).get("/v1/metrics/daily", {"days": 1})
            panels.append({"ws": workspace, "bars": views.token_bars(sessions["sessions"], workspace),
                           "last_outcomes": daily.get("last_outcomes") or {},
                           "warnings": warnings(status, workspace)})
        return self.render(request, "overview.html", page="overview", status=status, panels=panels,
                           workspace=None)

    def memory(self, request: Request) -> Response:
        client, status, workspace = self._frame(request)
        files = client.get("/v1/memory-files", {"day": request.query_params.get("day") or "latest"})
        day = files.get("day") or ""
        before = request.query_params.get("before") or None
        history = client.get("/v1/history", {"limit": HISTORY_PAGE, "before": before})
        query = request.query_params.get("q", "").strip()
        found = client.get("/v1/search", {"q": query, "limit": 20}) if query else None
        return self.render(request, "memory.html", page="memory", status=status, workspace=workspace, files=files,
                           day=day, history=history, query=query, found=found)

    def runs(self, request: Request) -> Response:
        client, status, workspace = self._frame(request)
        everything = request.query_params.get("all") == "1"
        listed = client.get("/v1/runs", {"limit": RUNS_PAGE, "workspace": workspace.get("name"),
                                         "all": everything})
        rows = [dict(run, headline=runtext.headline(run)) for run in listed["runs"]]
        return self.render(request, "runs.html", page="runs", status=status, workspace=workspace, runs=rows,
                           hidden=listed.get("hidden_unchanged", 0), everything=everything)

    def run(self, request: Request, *, plan: dict | None = None, restored: dict | None = None,
            problem: str | None = None) -> Response:
        client, status, workspace = self._frame(request)
        run = client.get(f"/v1/runs/{quote(request.path_params['run_id'], safe='')}")["run"]
        commit = None
        if run.get("kind") == "dream" or (run.get("manifest") or {}).get("commit"):
            try:
                commit = client.get("/v1/dream-log", {"target": run["run_id"],
                                                      "workspace": run.get("workspace")})["commit"]
            except DaemonError:
                commit = None
        return self.render(request, "run.html", page="runs", status=status, workspace=workspace, run=run,
                           details=[line for line in runtext.detail_lines(run) if not line.startswith("(--json")],
                           commit=commit,
                           diff=views.diff_lines(commit.get("diff") or "") if commit else [],
                           plan=plan, restored=restored, problem=problem)

    def restore(self, request: Request, *, dry_run: bool = False) -> Response:
        """Start the restore and wait (up to a minute) for its end, then show what it did; with *dry_run* show what it
        would change, with the button that does it."""
        client = self.client_for(None)
        try:
            started = client.post("/v1/restore", {"target": request.path_params["run_id"], "dry_run": dry_run})
        except DaemonError as exc:
            return self.run(request, problem=exc.message)
        if dry_run:
            return self.run(request, plan=started)
        restore_run: dict = {}
        run_path = f"/v1/runs/{quote(started['run_id'], safe='')}"
        for _ in range(RESTORE_WAIT_ROUNDS):
            restore_run = client.get(run_path, {"wait_ms": RESTORE_WAIT_MS})["run"]
            if restore_run.get("state") not in runtext.OPEN_STATES:
                break
        restored = dict(restore_run, lines=runtext.summary_lines(restore_run))
        return self.run(request, restored=restored)

    def health(self, request: Request) -> Response:
        client, status, workspace = self._frame(request)
        daily = client.get("/v1/metrics/daily", {"days": HEALTH_DAYS})
        observed = client.get("/v1/metrics", {"since": f"{HEALTH_DAYS}d"})
        days = views.day_range(daily["from"], HEALTH_DAYS)
        history = {day: {"entries": count} for day, count in (daily.get("history_entries") or {}).items()}
        charts = [views.day_chart("History entries per day", days, history),
                  views.day_chart("Consolidation outcomes", days,
                                  views.day_counts(daily["outcomes"], ("consolidate",), "outcome")),
                  views.day_chart("Flushes beside consolidations (compactions)", days,
                                  views.day_counts(daily["outcomes"], ("flush", "consolidate"), "kind")),
                  views.day_chart("Dream outcomes", days, views.day_counts(daily["outcomes"], ("dream",), "outcome"))]
        samples = daily.get("samples") or []
        megabytes = {str(row["day"]): f"{(row.get('index_db_bytes') or 0) / 1048576:,.1f} MB" for row in samples}
        charts += [views.day_chart("Archived twice (goal: 0)", days,
                                   views.sample_series(samples, "archived_twice", "messages"), levels=True),
                   views.day_chart("Search index size", days, views.sample_series(samples, "index_units", "units"),
                                   levels=True, notes=megabytes)]
        rows = [row for row in observed.get("rows") or [] if row.get("workspace") == workspace.get("name")]
        return self.render(request, "health.html", page="health", status=status, workspace=workspace,
                           charts=charts, rows=rows, archived_twice=(observed.get("archived_twice") or {}),
                           restores=observed.get("restores") or {})


def warnings(status: dict, workspace: dict) -> list[str]:
    """What needs a look in one workspace, in words."""
    found = [f"restart nanobotd to apply {key}" for key in status.get("restart_needed") or []]
    if workspace.get("llm_mode") == "offline":
        found.append("no LLM configured: archives are raw, and the flush and the dream do not run")
    if not (workspace.get("watcher") or {}).get("healthy", True):
        found.append("the session watcher is not healthy; changes are found by the periodic scan")
    if workspace.get("archived_twice"):
        found.append(f"{workspace['archived_twice']} message(s) archived twice, by the agent and by nanobotd")
    if workspace.get("scan_errors"):
        found.append(f"{workspace['scan_errors']} session file(s) could not be read")
    if workspace.get("corrupt_lines"):
        found.append(f"{workspace['corrupt_lines']} unreadable line(s) in session files")
    if (workspace.get("git") or {}).get("available") is False:
        found.append("git is not available: dreams cannot be committed or restored by commit")
    if (workspace.get("agent") or {}).get("error"):
        found.append(f"the agent's config could not be read: {workspace['agent']['error']}")
    return found


def build_app(client_for: ClientFactory, keys: Secrets) -> Guard:
    """The whole page: routes, static files and the guard in front."""
    pages = Pages(client_for, keys)

    def page(method: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                return method(request)
            except CannotConnect as exc:
                return pages.render(request, "error.html", 503, title="nanobotd is not answering",
                                    message=f"{exc} {exc.hint}", status={}, workspace=None)
            except DaemonError as exc:
                code = exc.status if exc.status in (400, 404, 409) else 502
                return pages.render(request, "error.html", code, title="The daemon refused",
                                    message=exc.message, status={}, workspace=None)
        return endpoint

    routes = [
        Route("/", page(pages.overview)),
        Route("/memory", page(pages.memory)),
        Route("/runs", page(pages.runs)),
        Route("/runs/{run_id}", page(pages.run)),
        Route("/runs/{run_id}/preview", page(lambda request: pages.restore(request, dry_run=True)), methods=["POST"]),
        Route("/runs/{run_id}/restore", page(pages.restore), methods=["POST"]),
        Route("/health", page(pages.health)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Guard(Starlette(routes=routes), keys)
