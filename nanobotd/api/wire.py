"""HTTP/1.1 framing for the control API: read one bounded request, write one JSON response.

Everything a client can get wrong raises ApiError with the status to answer; a client that goes away
mid-request raises ClientGone. Limits are checked before data is read, never after.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import PurePath
from typing import Any
from urllib.parse import parse_qsl

from nanobotd.api.router import ApiError, Response

MAX_BODY_BYTES = 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_COUNT = 100
MAX_QUERY_FIELDS = 100


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""


@dataclass
class RequestHead:
    """The request line and headers (names lower-cased) of one request."""

    method: str
    target: str
    headers: dict[str, str]


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readline()
    except ValueError:  # longer than the reader's limit
        raise ApiError(431, "headers_too_large", f"request head over {MAX_HEAD_BYTES} bytes") from None
    if line and not line.endswith(b"\n"):
        raise ClientGone()
    return line


async def read_head(reader: asyncio.StreamReader) -> RequestHead | None:
    """The request line and headers, or None when the client closed without sending anything."""
    line = await _read_line(reader)
    total = len(line)
    while line in (b"\r\n", b"\n"):  # RFC 9112 lets a server skip blank lines before the request line
        line = await _read_line(reader)
        total += len(line)
        if total > MAX_HEAD_BYTES:
            raise ApiError(431, "headers_too_large", f"request head over {MAX_HEAD_BYTES} bytes")
    if not line:
        return None
    method, target = _parse_request_line(line)
    headers: dict[str, str] = {}
    while True:
        line = await _read_line(reader)
        if not line:
            raise ClientGone()
        total += len(line)
        if total > MAX_HEAD_BYTES or len(headers) > MAX_HEADER_COUNT:
            raise ApiError(431, "headers_too_large", f"request head over {MAX_HEAD_BYTES} bytes or "
                                                     f"{MAX_HEADER_COUNT} headers")
        if line in (b"\r\n", b"\n"):
            return RequestHead(method, target, headers)
        name, separator, value = line.decode("latin-1").partition(":")
        if not separator or not name or name != name.strip():
            raise ApiError(400, "bad_request", "malformed header line")
        name, value = name.lower(), value.strip()
        if name in headers and name == "content-length" and headers[name] != value:
            raise ApiError(400, "bad_request", "conflicting Content-Length headers")
        headers[name] = f"{headers[name]}, {value}" if name in headers and name != "content-length" else value


def _parse_request_line(line: bytes) -> tuple[str, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3:
        raise ApiError(400, "bad_request", "malformed request line")
    method, target, version = parts
    if not (method.isascii() and method.isalpha() and method.isupper()):
        raise ApiError(400, "bad_request", "malformed request method")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise ApiError(400, "bad_request", f"unsupported protocol version {version[:20]!r}")
    if not target.startswith("/"):
        raise ApiError(400, "bad_request", "the request target must be a path starting with '/'")
    return method, target


async def read_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: RequestHead) -> bytes:
    """The body announced by Content-Length, refused before reading when it is too large."""
    if "transfer-encoding" in head.headers:
        raise ApiError(411, "length_required", "chunked request bodies are not supported; send Content-Length")
    raw_length = head.headers.get("content-length")
    if raw_length is None:
        return b""
    if not (raw_length.isascii() and raw_length.isdigit()):
        raise ApiError(400, "bad_request", "Content-Length must be a non-negative integer")
    length = int(raw_length)
    if length > MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"request body of {length} bytes is over the "
                                                 f"{MAX_BODY_BYTES} byte limit")
    if head.headers.get("expect", "").lower() == "100-continue" and length:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return await reader.readexactly(length)


def parse_query(query_string: str) -> dict[str, str]:
    """Query parameters as a dict (last one wins, blanks kept); 400 when malformed or too many."""
    try:
        return dict(parse_qsl(query_string, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS,
                              errors="strict"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise ApiError(400, "bad_request", f"malformed query string: {exc}") from None


def parse_json(body: bytes) -> Any:
    """The parsed JSON body, or None for an empty one; 400 when it is not JSON."""
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "bad_json", f"the request body is not valid JSON: {str(exc)[:200]}") from None


def as_response(result: Any) -> Response:
    """A handler's result as a Response: a dict means 200."""
    if isinstance(result, Response):
        return result
    if isinstance(result, dict):
        return Response(200, result)
    raise TypeError(f"a control handler returned {type(result).__name__}, not a dict or Response")


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


def encode(response: Response) -> bytes:
    """The response as bytes on the wire; raises TypeError when the body is not JSON-serializable."""
    if isinstance(response.body, str) and response.content_type != "application/json":
        body = response.body.encode("utf-8")
    else:
        body = b"" if response.body is None else json.dumps(response.body, ensure_ascii=False,
                                                             default=_json_default).encode("utf-8")
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
             f"Content-Length: {len(body)}", "Connection: close"]
    for name, value in response.headers.items():
        lines.append(f"{name}: {' '.join(str(value).splitlines())}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace") + body


def encode_error(error: ApiError) -> bytes:
    """An ApiError as bytes on the wire."""
    return encode(error.to_response())


