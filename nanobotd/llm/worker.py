"""The LLM worker process: the only place litellm is ever imported.

litellm costs seconds and ~190 MB to import and never gives that memory back, so the daemon runs its
LLM calls here, in a child it starts on demand and lets go when idle (`llm.process`). The worker reads
calls from stdin, runs them concurrently with litellm, classifies failures where litellm's exceptions
live, and answers on stdout (`llm.protocol`). It lives exactly as long as its stdin: the daemon closing
it, or dying, ends the worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NoReturn

from nanobotd.llm.failures import BAD_RESPONSE, Failure, LLMBadResponse, classify_failure, redact
from nanobotd.llm.protocol import OP_CANCEL, OP_COMPLETE, OP_EMBED, OP_GO, decode, encode, failure_to_json
from nanobotd.llm.reply import response_dict

MAX_LINE_BYTES = 256 * 1024 * 1024  # one request line: a whole prompt, so no small stream limit


@dataclass
class Gate:
    """A gated call's hold on its HTTP request: opened by the daemon's "go" (or by a call of the same
    *slots* whose request is answered); *released* runs the moment the request has its answer (or failed),
    so its slot is free while litellm still reads the answer."""

    call_id: int
    slots: object  # which of the daemon's slot sets the call waits on
    released: Callable[[Gate], None]
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    used: bool = False


# The gate of the call running in this context (None: the call sends at once).
CALL_GATE: contextvars.ContextVar[Gate | None] = contextvars.ContextVar("llm_call_gate", default=None)


def import_litellm() -> Any:
    """Import and quiet litellm: no network at import, no telemetry, no "Give Feedback" banners."""
    # Without this litellm fetches its model cost map from GitHub while importing.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    # litellm attaches its own stderr handler at import; route its records through ours.
    from nanobotd.logsetup import capture_library_loggers

    capture_library_loggers()
    return litellm


def gate_http_sends() -> None:
    """Hold the HTTP request of a gated call until its "go", and free its slot as soon as it is answered
    (`llm.protocol`).

    Every async provider in litellm (the OpenAI SDK and litellm's own handler alike) sends through
    httpx.AsyncClient.send, so the gate sits there: litellm does all its work on a call up to the request
    itself, then waits. A call's first request is the one gated; any further one (an auth refresh) passes.
    A streamed answer is still arriving when send returns, so its slot is freed with the call's answer.
    """
    import httpx

    send = httpx.AsyncClient.send
    if getattr(send, "gated", False):
        return

    async def gated_send(client: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        gate = CALL_GATE.get()
        if gate is None or gate.used:
            return await send(client, request, **kwargs)
        gate.used = True
        await gate.opened.wait()
        try:
            response = await send(client, request, **kwargs)
        finally:
            if not kwargs.get("stream"):
                gate.released(gate)
        # Let a call this one's slot was handed to send its request before litellm reads this answer.
        await asyncio.sleep(0)
        return response

    gated_send.gated = True  # type: ignore[attr-defined]
    httpx.AsyncClient.send = gated_send  # type: ignore[method-assign]


def warm_up() -> None:
    """Import what litellm's first call would (~450 modules of the openai SDK, a second or more on a busy
    machine), so no call's timeout pays for it: the worker announces itself ready only after this."""
    import openai

    client = openai.AsyncOpenAI(api_key="sk-none", base_url="http://127.0.0.1/v1", max_retries=0)
    _ = client.chat.completions, client.embeddings  # the SDK imports a resource when it is first touched


class Channel:
    """The worker's side of the pipe to the daemon: one JSON line per message, from any thread."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._lock = threading.Lock()
        self.secrets: set[str] = set()

    def send(self, message: dict) -> None:
        """Write one message; a daemon that went away ends the worker through stdin, so errors are dropped."""
        data = encode(message)
        with self._lock:
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def redact(self, text: str) -> str:
        """*text* with every API key a call brought, and bearer tokens, blanked out."""
        for secret in self.secrets:
            text = redact(text, secret)
        return redact(text, None)


class ForwardingHandler(logging.Handler):
    """Hands library log records to the daemon, whose log sink formats and masks them like its own."""

    def __init__(self, channel: Channel):
        super().__init__(logging.WARNING)
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        """Send the record's level, logger name and (redacted) message up the pipe."""
        try:
            message = self.channel.redact(record.getMessage())
        except Exception:  # a library's bad format string must not kill a call
            message = str(record.msg)
        self.channel.send({"log": {"level": record.levelname, "name": record.name, "message": message}})


class Worker:
    """Runs the daemon's calls on one event loop, several at once, until stdin closes."""

    def __init__(self, litellm: Any, channel: Channel):
        self.litellm = litellm
        self.channel = channel
        self.calls: dict[int, asyncio.Task] = {}
        self.gates: dict[int, Gate] = {}  # gated calls still waiting for their "go"

    async def serve(self, stdin: BinaryIO) -> None:
        """Announce readiness, then dispatch calls and cancels; on end of input, drop what is left."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
        self.channel.send({"ready": os.getpid()})
        while line := await reader.readline():
            try:
                self.dispatch(decode(line))
            except (ValueError, KeyError, TypeError) as error:
                logging.getLogger(__name__).warning("LLM worker: unreadable message dropped: %s", error)
        for task in self.calls.values():
            task.cancel()
        await asyncio.gather(*self.calls.values(), return_exceptions=True)

    def dispatch(self, message: dict) -> None:
        """Start a call, let a gated one send, or cancel one the daemon no longer waits for."""
        call_id = int(message["id"])
        op = message.get("op")
        if op == OP_CANCEL:
            task = self.calls.get(call_id)
            if task is not None:
                task.cancel()
        elif op == OP_GO:
            gate = self.gates.pop(call_id, None)
            if gate is not None:
                gate.opened.set()
        elif op in (OP_COMPLETE, OP_EMBED):
            request = dict(message["request"])
            if request.get("api_key"):
                self.channel.secrets.add(str(request["api_key"]))
            function = self.litellm.acompletion if op == OP_COMPLETE else self.litellm.aembedding
            gate = None
            if message.get("gated"):
                gate = self.gates[call_id] = Gate(call_id, message.get("slots"), self.hand_on)
            task = asyncio.get_running_loop().create_task(self.run(call_id, function, request,
                                                                   float(message["timeout"]), gate))
            self.calls[call_id] = task
            task.add_done_callback(lambda _done: self.forget(call_id))

    def hand_on(self, freed: Gate) -> None:
        """A gated call's request is answered: its slot goes straight to this worker's longest-waiting call on
        the same slots, if any, and the daemon hears of both in one message."""
        message: dict[str, Any] = {"id": freed.call_id, "released": True}
        for call_id, gate in self.gates.items():
            if gate.slots == freed.slots:
                del self.gates[call_id]
                gate.opened.set()
                message["handed_to"] = call_id
                break
        self.channel.send(message)

    def forget(self, call_id: int) -> None:
        """A call ended (answered, failed or cancelled)."""
        self.calls.pop(call_id, None)
        self.gates.pop(call_id, None)

    async def run(self, call_id: int, function: Any, request: dict, timeout: float,
                  gate: Gate | None = None) -> None:
        """One litellm call under *timeout* (from its "go", when gated), answered with its result or the
        classified failure."""
        try:
            response, started = await self.call(function, request, timeout, gate)
            data = response_dict(response)
            latency_ms = (time.perf_counter() - started) * 1000
        except LLMBadResponse as error:
            failure = Failure(BAD_RESPONSE, error)
        except Exception as error:  # CancelledError is a BaseException: a cancelled call sends nothing
            failure = classify_failure(error)
        else:
            self.channel.send({"id": call_id, "response": data, "latency_ms": latency_ms})
            return
        self.channel.send({"id": call_id, "failure": failure_to_json(failure)})

    @staticmethod
    async def call(function: Any, request: dict, timeout: float, gate: Gate | None) -> tuple[Any, float]:
        """litellm's response and when its timeout started: at once, or for a gated call when its gate opened
        (litellm prepares the request meanwhile and holds it at the gate)."""
        CALL_GATE.set(gate)  # this call's own task and context
        if gate is None:
            started = time.perf_counter()
            # litellm's own timeout is not always honoured by a server that accepts and then stalls.
            return await asyncio.wait_for(function(**request), timeout), started
        call = asyncio.ensure_future(function(**request))
        opened = asyncio.ensure_future(gate.opened.wait())
        try:
            await asyncio.wait((call, opened), return_when=asyncio.FIRST_COMPLETED)
            started = time.perf_counter()
            return await asyncio.wait_for(call, timeout), started
        finally:
            opened.cancel()
            call.cancel()


def main() -> NoReturn:
    """Serve the daemon on stdin/stdout until stdin closes, then exit."""
    # The daemon decides when the worker ends (it closes stdin, or dies): a terminal's Ctrl-C or a service
    # manager's SIGTERM to the whole group must not kill calls the daemon is still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = Channel(os.fdopen(os.dup(sys.stdout.fileno()), "wb"))
    # Anything a library prints goes to stderr, never into the protocol.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    litellm = import_litellm()
    warm_up()
    gate_http_sends()
    logging.basicConfig(handlers=[ForwardingHandler(channel)], level=logging.WARNING, force=True)
    asyncio.run(Worker(litellm, channel).serve(sys.stdin.buffer))
    # Nothing is left to save, and an interpreter tearing litellm down takes seconds (longer on a busy
    # machine) while holding its ~190 MB: leave at once.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
