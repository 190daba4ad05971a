"""Requests, responses and the path router of the control API.

Handlers are `async def handler(request) -> Response | dict`; they raise ApiError for anything the
caller got wrong, and the server turns it into `{"error": {"code", "message"}}` with its status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

MISSING = object()


class ApiError(Exception):
    """A request the daemon refuses; becomes an error body with this status and code."""

    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def to_response(self) -> Response:
        """The error as it goes on the wire."""
        return Response(self.status, {"error": {"code": self.code, "message": self.message}}, headers=self.headers)


@dataclass
class Response:
    """A JSON response with an explicit status (202 for queued runs, errors, ...).

    A str body with another *content_type* goes on the wire as it is (the Prometheus text format).
    """

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


@dataclass
class Request:
    """One parsed control request.

    path is the request path as sent (still percent-encoded, no query); params holds the decoded
    `{name}` segments of the matched route; body is the parsed JSON or None when there was none.
    """

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    body: Any = None
    peer_uid: int | None = None
    peer_pid: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def json_object(self) -> dict:
        """The body as a JSON object ({} when there is none); 400 when it is another JSON type."""
        if self.body is None:
            return {}
        if not isinstance(self.body, dict):
            raise ApiError(400, "bad_request", "the request body must be a JSON object")
        return self.body

    def body_value(self, name: str, kind: type | tuple[type, ...], default: Any = MISSING) -> Any:
        """One field of the JSON body, type-checked; 400 naming the field when missing or mistyped."""
        body = self.json_object()
        if name not in body or body[name] is None:
            if default is MISSING:
                raise ApiError(400, "bad_param", f"missing field '{name}'")
            return default
        value = body[name]
        if not _is_kind(value, kind):
            raise ApiError(400, "bad_param", f"field '{name}' must be {_kind_name(kind)}")
        return value

    def query_int(self, name: str, default: int | None = None, *, minimum: int | None = None,
                  maximum: int | None = None) -> int | None:
        """An integer query parameter (blank counts as absent); 400 when it is not a number or out of range."""
        raw = self.query.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, "bad_param", f"query parameter '{name}' must be an integer") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f"{minimum if minimum is not None else '-inf'}..{maximum if maximum is not None else 'inf'}"
            raise ApiError(400, "bad_param", f"query parameter '{name}' must be in {bounds}")
        return value


Handler = Callable[[Request], Awaitable["Response | dict"]]


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: str
    segments: tuple[str, ...]
    handler: Handler

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.segments):
            return None
        params = {}
        for wanted, given in zip(self.segments, segments, strict=True):
            if wanted.startswith("{"):
                if not given:
                    return None
                params[wanted[1:-1]] = given
            elif wanted != given:
                return None
        return params


class Router:
    """Maps (method, path pattern) to handlers; `{name}` matches one URL-decoded path segment."""

    def __init__(self) -> None:
        self._routes: list[_Route] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """Register *handler* for *method* on *pattern* such as "/v1/sessions/{key}"."""
        if not pattern.startswith("/"):
            raise ValueError(f"route pattern must start with '/': {pattern!r}")
        method = method.upper()
        segments = tuple(pattern.split("/")[1:])
        for segment in segments:
            if ("{" in segment or "}" in segment) and not (segment.startswith("{") and segment.endswith("}")):
                raise ValueError(f"a path parameter must be a whole segment: {pattern!r}")
        if any(route.method == method and _shape(route.segments) == _shape(segments) for route in self._routes):
            raise ValueError(f"route already registered: {method} {pattern}")
        self._routes.append(_Route(method, pattern, segments, handler))

    def routes(self) -> list[tuple[str, str]]:
        """(method, pattern) of every route, in registration order."""
        return [(route.method, route.pattern) for route in self._routes]

    def resolve(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """The handler and decoded path params for a request; ApiError 404 or 405 when none fits."""
        try:
            # Split before decoding, so a key holding an encoded "/" (%2F) stays one segment.
            segments = [unquote(segment, errors="strict") for segment in path.split("/")[1:]]
        except UnicodeDecodeError:
            raise ApiError(400, "bad_request", "the path is not valid UTF-8 once decoded") from None
        allowed = []
        for route in self._routes:
            params = route.match(segments)
            if params is None:
                continue
            if route.method == method.upper():
                return route.handler, params
            allowed.append(route.method)
        if allowed:
            raise ApiError(405, "method_not_allowed", f"{method} is not allowed on {path} (allowed: "
                           f"{', '.join(sorted(set(allowed)))})", headers={"Allow": ", ".join(sorted(set(allowed)))})
        raise ApiError(404, "not_found", f"no such endpoint: {path}")


def _shape(segments: tuple[str, ...]) -> tuple[str, ...]:
    return tuple("{}" if segment.startswith("{") else segment for segment in segments)


def _is_kind(value: Any, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python, but a JSON true must not pass for a number; an integer is a fine float.
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object"}
    return " or ".join(names.get(item, item.__name__) for item in kinds)
