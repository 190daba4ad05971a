"""The LLM worker child: the only place litellm is ever imported (`llm.process` starts and feeds it).

It runs calls from stdin concurrently, classifies failures where litellm's exceptions live, answers on stdout a JSON
object a line, ends with its stdin (the daemon closing it, or dying) and leaves after argv[1] idle seconds.

A call with slots ([KEY, COUNT]) holds one of COUNT (a Semaphore per KEY) only while its HTTP request is out: taken
after litellm builds the request, given back once the answer's body is read (before litellm parses it), so the next
request goes out at once. That happens in the HTTP transport of OpenAI SDK requests (`litellm.aclient_session`); a model
not seen there holds its slot for the whole call."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, BinaryIO, NoReturn

from nanobotd import tuning
from nanobotd.llm.failures import BAD_RESPONSE, LLMBadResponse, classify_failure


class Slot:
    """One call's claim on its slots' semaphore, taken at most once; *on_take* runs when it is taken."""

    def __init__(self, semaphore: asyncio.Semaphore, on_take: Callable[[], None]):
        self.semaphore, self.on_take = semaphore, on_take
        self.held = self.used = False  # used: taken, or being taken (the transport lets further requests pass)
        self.seen = False  # a request of the call reached the transport

    async def take(self) -> None:
        self.used = True
        await self.semaphore.acquire()
        self.held = True
        self.on_take()

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.semaphore.release()


# The slot of the call running in this task (None: its requests are not bounded).
CALL_SLOT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("llm_call_slot", default=None)


def slot_client() -> Any:
    """An httpx client for litellm whose transport holds a call's first request until its slot is free, and
    frees the slot when the answer's body has been read (a streamed answer: when the stream closes)."""
    import httpx
    from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

    class SlotStream(httpx.AsyncByteStream):
        def __init__(self, stream: Any, slot: Slot):
            self.stream, self.slot = stream, slot

        def __aiter__(self) -> Any:
            return self.stream.__aiter__()

        async def aclose(self) -> None:
            await self.stream.aclose()
            if self.slot.held:
                self.slot.give_back()
                await asyncio.sleep(0)  # the call the slot went to sends its request before this answer is parsed

    class SlotTransport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            slot = CALL_SLOT.get()
            if slot is not None:
                slot.seen = True
            if slot is None or slot.used:  # not bounded, or its slot is taken already (a further request passes)
                return await super().handle_async_request(request)
            await slot.take()
            response = await super().handle_async_request(request)  # on an error, the call gives its slot back
            response.stream = SlotStream(response.stream, slot)
            return response

    return httpx.AsyncClient(transport=SlotTransport(verify=get_ssl_configuration()), follow_redirects=True)


def import_litellm() -> Any:
    """Import and quiet litellm (no network at import, no telemetry, no banners), and what its first call
    would import (the openai SDK's resources), so no call's timeout pays for it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else it fetches the cost map from GitHub
    import litellm
    import openai

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    from nanobotd.logsetup import capture_library_loggers

    capture_library_loggers()  # litellm attaches its own stderr handler at import; its records go through ours
    client = openai.AsyncOpenAI(api_key="sk-none", base_url="http://127.0.0.1/v1", max_retries=0)
    _ = client.chat.completions, client.embeddings  # the SDK imports a resource when it is first touched
    return litellm


class Worker:
    """Runs the daemon's calls on one event loop, several at once, until stdin closes or it is idle."""

    def __init__(self, litellm: Any, out: BinaryIO, idle_exit_seconds: float):
        self.litellm = litellm
        self.out = out
        self.idle_exit_seconds = idle_exit_seconds
        self.calls: dict[int, asyncio.Task] = {}
        self.semaphores: dict[str, asyncio.Semaphore] = {}
        self.transport_seen: dict[tuple, bool] = {}  # (model, api_base) -> its requests pass our transport
        self.idle: asyncio.TimerHandle | None = None

    async def serve(self, stdin: BinaryIO) -> None:
        """Announce readiness, then dispatch calls and cancels until the end of input (what still runs is
        dropped as the worker leaves)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=tuning.LLM_REQUEST_LINE_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
        self.send({"ready": os.getpid()})
        self.wait_idle()
        while line := await reader.readline():
            try:
                self.dispatch(json.loads(line))
            except (ValueError, KeyError, TypeError) as error:
                logging.getLogger(__name__).warning("LLM worker: unreadable message dropped: %s", error)

    def send(self, message: dict) -> None:
        """One message to the daemon; one that went away ends the worker through stdin, so errors are dropped."""
        try:
            self.out.write(json.dumps(message, default=str, ensure_ascii=False).encode() + b"\n")
            self.out.flush()
        except (OSError, ValueError):
            pass

    def wait_idle(self) -> None:
        """(Re)start the idle clock, or stop it while calls run."""
        if self.idle is not None:
            self.idle.cancel()
        self.idle = None if self.calls else asyncio.get_running_loop().call_later(self.idle_exit_seconds, leave)

    def dispatch(self, message: dict) -> None:
        """Start a call, or cancel one the daemon no longer waits for."""
        call_id = int(message["id"])
        if message["op"] == "cancel":
            if call_id in self.calls:
                self.calls[call_id].cancel()
            return
        request = dict(message["request"])
        task = asyncio.get_running_loop().create_task(
            self.run(call_id, message["op"], request, float(message["timeout"]), message.get("slots")))
        self.calls[call_id] = task
        self.wait_idle()

        def forget(_task: asyncio.Task) -> None:
            self.calls.pop(call_id, None)
            self.wait_idle()

        task.add_done_callback(forget)

    async def run(self, call_id: int, op: str, request: dict, timeout: float, slots: list | None) -> None:
        """One litellm call, timed from when it holds its slot, answered with its result or its failure."""
        model = (request.get("model"), request.get("api_base"))
        slot = None
        started = time.perf_counter()
        try:
            # litellm's own timeout is not always honoured by a server that accepts and then stalls.
            async with asyncio.timeout(None) as deadline:

                def start() -> None:
                    nonlocal started
                    started = time.perf_counter()
                    loop = asyncio.get_running_loop()
                    deadline.reschedule(loop.time() + timeout)
                    loop.call_soon(self.send, {"id": call_id, "sending": True})  # once the request is on its way

                if slots:
                    slot = Slot(self.semaphores.setdefault(str(slots[0]), asyncio.Semaphore(int(slots[1]))), start)
                    CALL_SLOT.set(slot)  # this task's own context
                    if not self.transport_seen.get(model):
                        await slot.take()
                else:
                    start()
                function = self.litellm.acompletion if op == "complete" else self.litellm.aembedding
                response = await function(**request)
            if not hasattr(response, "model_dump"):
                raise LLMBadResponse(f"unexpected response type {type(response).__name__}", kind=BAD_RESPONSE)
            answer = {"id": call_id, "response": response.model_dump(),
                      "latency_ms": (time.perf_counter() - started) * 1000}
        except Exception as error:  # CancelledError is a BaseException: a cancelled call sends nothing
            answer = {"id": call_id, "failure": asdict(classify_failure(error))}
        finally:
            if slot is not None:
                slot.give_back()
                self.transport_seen[model] = slot.seen
        self.send(answer)


def leave() -> NoReturn:
    """Exit at once: nothing is left to save, and an interpreter tearing litellm down takes seconds while
    it holds all its memory."""
    sys.stderr.flush()
    os._exit(0)


def main() -> NoReturn:
    """Serve the daemon on stdin/stdout until stdin closes or the worker is idle, then exit."""
    # The daemon decides when the worker ends: a terminal's Ctrl-C or a service manager's SIGTERM to the
    # whole group must not kill calls the daemon is still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    # What a library prints or logs goes to stderr, never into the protocol; the daemon logs it (redacted).
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    litellm = import_litellm()
    litellm.aclient_session = slot_client()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
    asyncio.run(Worker(litellm, out, float(sys.argv[1])).serve(sys.stdin.buffer))
    leave()
