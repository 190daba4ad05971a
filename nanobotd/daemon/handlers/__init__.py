"""Control API handlers, one module per resource, each a list of ROUTES of handler(core, request);
`all_routes` puts every endpoint together."""

from __future__ import annotations

from nanobotd.api.app import Routes
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers import browse, memory, reports, search, sessions, status
from nanobotd.daemon.handlers.common import bind


def all_routes(core: Core) -> Routes:
    """Every endpoint of the control API: (method, path pattern, handler)."""
    return [route for module in (memory, status, sessions, search, reports, browse)
            for route in bind(core, module.ROUTES)]
