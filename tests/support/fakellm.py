"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scripted answers.

Tests and benchmarks point litellm at it so the whole client stack (litellm, the OpenAI SDK, httpx, sockets)
runs for real; only the model's words are scripted. A request with ``"stream": true`` is answered with
server-sent chunks in OpenAI's streaming format (nanobot always streams). Also runnable as a process for daemon tests:
``python -m tests.support.fakellm --port N --latency 0.2 --reply TEXT`` prints the base URL and serves.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAKE_MODEL_NAME = "fake-model"
DEFAULT_REPLY = "(nothing)"
HUNG_REPLY = "(hung)"
POLL_SECONDS = 0.02  # how fast serve_forever notices shutdown(); the stdlib default 0.5 s slows every test
CLIENT_GONE_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
EMBEDDING_DIMENSIONS = 64  # /v1/embeddings answers vectors this long unless the request asks "dimensions"
STREAM_PIECE_CHARS = 16  # streamed content and tool arguments arrive in pieces this long, as real servers send them


@dataclass
class Text:
    """A plain assistant message."""

    content: str
    finish_reason: str = "stop"
    prompt_tokens: int = 10
    completion_tokens: int = 5


@dataclass
class ToolCalls:
    """An assistant message calling tools; a call's arguments may be a raw string to script malformed JSON."""

    calls: list[tuple[str, dict | str]]
    content: str = ""
    finish_reason: str = "tool_calls"
    prompt_tokens: int = 10
    completion_tokens: int = 5


@dataclass
class HttpError:
    """An HTTP error status with a body and optional headers (``Retry-After`` for 429s)."""

    status: int = 500
    body: str = '{"error": {"message": "boom"}}'
    headers: dict = field(default_factory=dict)


@dataclass
class Hang:
    """Wait before answering, so the client times out; stop() releases the wait at once."""

    seconds: float = 3600
    then: Any = None


@dataclass
class Garbage:
    """A 200 whose body is not the JSON a client expects."""

    body: bytes = b"not json{"


@dataclass
class Empty:
    """A valid completion whose message has no content and no tool calls (and no usage block)."""

    finish_reason: str = "stop"


@dataclass
class Responder:
    """Decide the answer from the request body, for content-dependent replies."""

    fn: Callable[[dict], Any]


Action = Text | ToolCalls | HttpError | Hang | Garbage | Empty | Responder
ACTION_TYPES = (Text, ToolCalls, HttpError, Hang, Garbage, Empty, Responder)


class FakeLLM:
    """An OpenAI-compatible server: chat completions from a script queue (then a default), embeddings by hashing."""

    def __init__(self, *, latency: float = 0.0, default: Any = None, host: str = "127.0.0.1", port: int = 0):
        self.latency = latency
        self.default = default
        self.model = f"openai/{FAKE_MODEL_NAME}"
        self.requests: list[dict] = []
        self.request_headers: list[dict] = []
        self.max_in_flight = 0
        self.in_flight = 0
        self._host = host
        self._port = port
        self._script: deque = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._call_ids = itertools.count(1)
        self.embeddings_error: HttpError | None = None  # set to make /v1/embeddings fail
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The URL to put in LLMSettings.api_base."""
        if self._server is None:
            raise RuntimeError("FakeLLM is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeLLM:
        """Bind the socket and serve from a daemon thread."""
        self._stopping.clear()
        self._server = ThreadingHTTPServer((self._host, self._port), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), name="fakellm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hung answers, stop serving and close the socket."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def push(self, *actions: Action) -> None:
        """Queue scripted answers, consumed one per request, in order."""
        with self._lock:
            self._script.extend(actions)

    @property
    def pending(self) -> int:
        """Scripted answers not consumed yet."""
        with self._lock:
            return len(self._script)

    def next_action(self, request: dict) -> Action:
        """The scripted answer for *request*, with Responders and a callable default resolved."""
        with self._lock:
            action = self._script.popleft() if self._script else None
        if action is None:
            action = self.default
        if action is None:
            action = Text(DEFAULT_REPLY)
        return self.resolve(action, request)

    def resolve(self, action: Any, request: dict) -> Action:
        """Follow Responders (and plain callables) until a concrete answer."""
        while isinstance(action, Responder) or (callable(action) and not isinstance(action, ACTION_TYPES)):
            action = action.fn(request) if isinstance(action, Responder) else action(request)
        if not isinstance(action, ACTION_TYPES):
            raise TypeError(f"not a FakeLLM action: {action!r}")
        return action

    def record(self, request: dict, headers: dict) -> None:
        """Remember a received request body and its headers."""
        with self._lock:
            self.requests.append(request)
            self.request_headers.append(headers)

    def enter_flight(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave_flight(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def wait(self, seconds: float) -> bool:
        """Sleep up to *seconds*; False when stop() cut the wait short."""
        if seconds <= 0:
            return not self._stopping.is_set()
        return not self._stopping.wait(seconds)

    def next_call_id(self) -> str:
        return f"call_{next(self._call_ids)}"


def fake_embedding(text: str, size: int = 64) -> list[float]:
    """A deterministic embedding: the text's letter trigrams hashed into *size* buckets, normalised.

    Texts sharing pieces of words come out close ("destress" and "stress relief"), so tests can see a
    vector search find what BM25's whole words miss, without any model.
    """
    vector = [0.0] * size
    for word in text.lower().split():
        padded = f" {''.join(ch for ch in word if ch.isalnum())} "
        for start in range(len(padded) - 2):
            digest = hashlib.blake2b(padded[start:start + 3].encode(), digest_size=4).digest()
            vector[int.from_bytes(digest, "big") % size] += 1.0
    norm = sum(value * value for value in vector) ** 0.5 or 1.0
    return [value / norm for value in vector]


def completion_body(action: Text | ToolCalls | Empty, model: str, call_ids: Callable[[], str]) -> dict:
    """The OpenAI chat.completion JSON for a message-shaped action."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    usage: dict | None = None
    if isinstance(action, Text):
        message["content"] = action.content
    elif isinstance(action, ToolCalls):
        message["content"] = action.content or None
        message["tool_calls"] = [
            {
                "id": call_ids(),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for name, arguments in action.calls
        ]
    if isinstance(action, (Text, ToolCalls)):
        usage = {
            "prompt_tokens": action.prompt_tokens,
            "completion_tokens": action.completion_tokens,
            "total_tokens": action.prompt_tokens + action.completion_tokens,
        }
    body = {
        "id": f"chatcmpl-{call_ids()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": action.finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def stream_chunks(body: dict, *, include_usage: bool = False, piece_chars: int = STREAM_PIECE_CHARS) -> list[dict]:
    """The same completion as OpenAI streams it: a role chunk, content and tool-call deltas in small pieces,
    a final chunk carrying finish_reason, then (when the request asked for it) a usage chunk with no choices."""
    choice = body["choices"][0]
    message = choice["message"]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in split_pieces(message.get("content") or "", piece_chars)]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function",
                   "function": {"name": function["name"], "arguments": ""}}
        chunks.append(chunk({"tool_calls": [opening]}))
        chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                   for piece in split_pieces(function["arguments"], piece_chars)]
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage and "usage" in body:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


def split_pieces(text: str, size: int) -> list[str]:
    """*text* cut into pieces of at most *size* characters (none for empty text)."""
    return [text[start:start + size] for start in range(0, len(text), size)]


def wants_usage(request: dict) -> bool:
    """Whether a streaming request asked for the usage chunk (``stream_options.include_usage``)."""
    options = request.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _make_handler(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """Serves one request against *fake*'s script."""

        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as real servers set it: otherwise the body written after the headers waits for the
        # client's delayed ACK (40 ms on Linux) and every answer arrives that much late.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            """Stay quiet: test output is for test failures."""

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send_json(200, {"object": "list", "data": [{"id": FAKE_MODEL_NAME, "object": "model"}]})
            else:
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path.rstrip("/").endswith("/embeddings"):
                return self._embeddings(raw)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                request = {"_unparsed": raw.decode("utf-8", "replace")}
            fake.record(request, {name.lower(): value for name, value in self.headers.items()})
            fake.enter_flight()
            try:
                self._answer(request)
            except CLIENT_GONE_ERRORS:
                self.close_connection = True
            finally:
                fake.leave_flight()

        def _answer(self, request: dict) -> None:
            if not fake.wait(fake.latency):
                return self._drop()
            action = fake.next_action(request)
            while isinstance(action, Hang):
                if not fake.wait(action.seconds):
                    return self._drop()
                action = fake.resolve(action.then or Text(HUNG_REPLY), request)
            if isinstance(action, HttpError):
                self._send(action.status, action.body.encode(), "application/json", action.headers)
            elif isinstance(action, Garbage):
                self._send(200, action.body, "application/json")
            else:
                body = completion_body(action, request.get("model", FAKE_MODEL_NAME), fake.next_call_id)
                if request.get("stream"):
                    self._send_stream(stream_chunks(body, include_usage=wants_usage(request)))
                else:
                    self._send_json(200, body)

        def _embeddings(self, raw: bytes) -> None:
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                request = {}
            fake.record(request, {name.lower(): value for name, value in self.headers.items()})
            if fake.embeddings_error is not None:
                return self._send(fake.embeddings_error.status, fake.embeddings_error.body.encode(), "application/json")
            texts = request.get("input") or []
            texts = [texts] if isinstance(texts, str) else texts
            size = int(request.get("dimensions") or EMBEDDING_DIMENSIONS)
            data = [{"object": "embedding", "index": index, "embedding": fake_embedding(str(text), size)}
                    for index, text in enumerate(texts)]
            self._send_json(200, {"object": "list", "data": data, "model": request.get("model", FAKE_MODEL_NAME),
                                  "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)}})

        def _drop(self) -> None:
            self.close_connection = True

        def _send_json(self, status: int, payload: dict) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status: int, data: bytes, content_type: str, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, str(value))
            self.end_headers()
            self.wfile.write(data)

        def _send_stream(self, chunks: list[dict]) -> None:
            events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
            data = ("".join(events) + "data: [DONE]\n\n").encode()
            self._send(200, data, "text/event-stream", {"Cache-Control": "no-cache"})

    return Handler


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, answering every request with --reply."""
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible chat completions server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--reply", default=DEFAULT_REPLY)
    args = parser.parse_args(argv)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    fake = FakeLLM(latency=args.latency, default=Text(args.reply), host=args.host, port=args.port).start()
    print(fake.base_url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
