"""Control API handlers, one module per resource; `build_router` puts every endpoint together."""

from __future__ import annotations

from nanobotd.api.router import Router
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers import browse, exposition, memory, reports, search, sessions, status


def build_router(core: Core) -> Router:
    """Every endpoint of the control API."""
    router = Router()
    for module in (status, sessions, memory, search, reports, browse, exposition):
        for method, pattern, handler in module.routes(core):
            router.add(method, pattern, handler)
    return router
