"""The control API as a starlette app: every handler a starlette route, through one adapter that turns ApiError into
`{"error": {"code", "message"}}` with its status. Every answer closes its connection: calls are few and small."""

from __future__ import annotations

import asyncio
import datetime
import errno
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any
from urllib.parse import unquote

from loguru import logger
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response as StarletteResponse
from starlette.routing import Route

from nanobotd.tuning import MAX_BODY_BYTES, MAX_HEAD_BYTES

KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
              dict: "an object"}


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
    """A JSON response with an explicit status (202 for queued runs, errors, ...); a str body with another
    *content_type* goes on the wire as it is (the Prometheus text format)."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


@dataclass
class Request:
    """One control request: params holds the decoded `{name}` segments of its route, body the parsed JSON
    (None when there was none)."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    body: Any = None

    def json_object(self) -> dict:
        """The body as a JSON object ({} when there is none); 400 when it is another JSON type."""
        if self.body is None:
            return {}
        if not isinstance(self.body, dict):
            raise ApiError(400, "bad_request", "the request body must be a JSON object")
        return self.body

    def body_value(self, name: str, kind: type = str) -> Any:
        """One field of the JSON body, type-checked (a JSON true is no number); 400 naming the field when missing or
        mistyped."""
        value = self.json_object().get(name)
        if value is None:
            raise ApiError(400, "bad_param", f"missing field '{name}'")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ApiError(400, "bad_param", f"field '{name}' must be {KIND_NAMES.get(kind, kind.__name__)}")
        return value

    def query_value(self, name: str, default: Any, parse: Callable[[str], Any], accepts: str) -> Any:
        """A query parameter through *parse* (blank counts as absent); 400 `must be <accepts>` when it raises
        ValueError."""
        raw = self.query.get(name, "").strip()
        if not raw:
            return default
        try:
            return parse(raw)
        except ValueError:
            raise ApiError(400, "bad_param", f"query parameter '{name}' must be {accepts}") from None

    def query_int(self, name: str, default: int | None = None, *, minimum: int | None = None,
                  maximum: int | None = None) -> int | None:
        """An integer query parameter (blank counts as absent); 400 when it is not a number or out of range."""
        value = self.query_value(name, None, int, "an integer")
        if value is None:
            return default
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f"{minimum if minimum is not None else '-inf'}..{maximum if maximum is not None else 'inf'}"
            raise ApiError(400, "bad_param", f"query parameter '{name}' must be in {bounds}")
        return value


Handler = Callable[[Request], Awaitable["Response | dict"]]
Routes = Iterable[tuple[str, str, Handler]]


def build_app(routes: Routes, *, read_timeout: float) -> Starlette:
    """The app serving (method, path pattern, handler) routes; `{key:path}` takes a segment holding "/"."""
    return Starlette(routes=[Route(pattern, endpoint(handler, read_timeout), methods=[method])
                             for method, pattern, handler in routes],
                     exception_handlers={HTTPException: _http_error})


def endpoint(handler: Handler, read_timeout: float) -> Callable[[StarletteRequest], Awaitable[StarletteResponse]]:
    """*handler* as a starlette endpoint: the request read within the limits, every failure a JSON error."""
    async def serve(request: StarletteRequest) -> StarletteResponse:
        try:
            result = await handler(await read_request(request, read_timeout))
            return encode(result if isinstance(result, Response) else Response(200, result))
        except ApiError as error:
            return encode(error.to_response())
        except asyncio.CancelledError:  # uvicorn cancels a request only when stop() ran out of grace for it
            return encode(ApiError(503, "stopping", "the daemon is stopping; try again when it is back").to_response())
        except Exception as exc:
            if disk_full(exc):
                logger.error("control handler for {} {} failed: {}", request.method, request.url.path, exc)
                return encode(ApiError(507, "disk_full", f"the daemon cannot write its files: {exc}. Free space on "
                                       "that disk and try again").to_response())
            logger.exception("control handler for {} {} failed", request.method, request.url.path)
            detail = f"{type(exc).__name__}: {exc}"[:300]
            return encode(ApiError(500, "internal", f"internal error ({detail}); see the daemon log").to_response())

    return serve



def disk_full(exc: BaseException | None) -> bool:
    """Whether *exc*, or an error it came from, is a full disk (OSError, or SQLite's "database or disk is full")."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def read_request(request: StarletteRequest, read_timeout: float) -> Request:
    """Our Request, its body refused before it is read when too large or chunked, and read within *read_timeout*."""
    scope = request.scope
    if scope["http_version"] not in ("1.0", "1.1"):
        raise ApiError(400, "bad_request", f"unsupported protocol version HTTP/{scope['http_version']}")
    if len(scope["raw_path"]) + len(scope["query_string"]) + sum(len(n) + len(v) + 4 for n, v in scope["headers"]) \
            > MAX_HEAD_BYTES:  # h11 enforces the limit only on a head that arrives in pieces
        raise ApiError(431, "headers_too_large", f"request head over {MAX_HEAD_BYTES} bytes")
    if "transfer-encoding" in request.headers:
        raise ApiError(411, "length_required", "chunked request bodies are not supported; send Content-Length")
    length = int(request.headers.get("content-length") or 0)  # h11 refused one that is not a number
    if length > MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"request body of {length} bytes is over the "
                                                 f"{MAX_BODY_BYTES} byte limit")
    raw_path = scope["raw_path"].decode("ascii")  # h11 lets only ASCII through
    try:
        unquote(raw_path, errors="strict")
    except UnicodeDecodeError:
        raise ApiError(400, "bad_request", "the path is not valid UTF-8 once decoded") from None
    if "" in request.path_params.values():  # "{key:path}" matches an empty segment too
        raise ApiError(404, "not_found", f"no such endpoint: {raw_path}")
    try:
        async with asyncio.timeout(read_timeout):
            body = await request.body() if length else b""
    except TimeoutError:
        raise ApiError(408, "request_timeout", f"request not received within {read_timeout:g}s") from None
    except ClientDisconnect:
        raise ApiError(400, "bad_request", "the client went away mid-request") from None
    return Request(request.method, raw_path, dict(request.path_params), dict(request.query_params), parse_json(body))


def parse_json(body: bytes) -> Any:
    """The parsed JSON body, or None for an empty one; 400 when it is not JSON."""
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "bad_json", f"the request body is not valid JSON: {str(exc)[:200]}") from None


def encode(response: Response) -> StarletteResponse:
    """The response for the wire; raises TypeError when the body is not JSON-serializable."""
    if isinstance(response.body, str) and response.content_type != "application/json":
        body = response.body.encode("utf-8")
    else:
        body = b"" if response.body is None else json.dumps(response.body, ensure_ascii=False,
                                                             default=_json_default).encode("utf-8")
    headers = {name: " ".join(str(value).splitlines()) for name, value in response.headers.items()}
    return StarletteResponse(body, response.status, {**headers, "Content-Type": response.content_type,
                                                     "Connection": "close"})


async def _http_error(request: StarletteRequest, exc: Exception) -> StarletteResponse:
    """starlette's own 404 (no route) and 405 (another method) in our error shape."""
    assert isinstance(exc, HTTPException)
    if not request.scope["raw_path"].startswith(b"/"):
        error = ApiError(400, "bad_request", "the request target must be a path starting with '/'")
    elif exc.status_code == 405:
        error = ApiError(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path} "
                         f"(allowed: {exc.headers['Allow']})", headers=dict(exc.headers or {}))
    else:
        error = ApiError(exc.status_code, "not_found", f"no such endpoint: {request.url.path}")
    return encode(error.to_response())


def _json_default(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
