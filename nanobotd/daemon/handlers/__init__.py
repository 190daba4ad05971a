"""Control API handlers, one module per resource; `all_routes` puts every endpoint together."""

from __future__ import annotations

from nanobotd.api.app import Routes
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers import browse, exposition, memory, reports, search, sessions, status


def all_routes(core: Core) -> Routes:
    """Every endpoint of the control API: (method, path pattern, handler)."""
    return [route for module in (status, sessions, memory, search, reports, browse, exposition)
            for route in module.routes(core)]
