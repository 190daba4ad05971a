"""The qmd program as processes: finding and checking it, bounded calls, a supervised `qmd mcp --http` child.

Each child gets a session of its own, so one killpg ends all it started (qmd runs node, whose native model code may
spawn helpers or hang on a download). Spawning has no await between fork and the try that ends the child, exits are
awaited on a pidfd, and a group is killed while its leader is unreaped, so its id cannot have been reused."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.client
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from loguru import logger

from nanobotd.fsio import LockTimeout, file_lock
from nanobotd.index.hit import SearchBackendError
from nanobotd.index.qmdoutput import QmdResult
from nanobotd.tuning import FILE_LOCK_POLL_SECONDS

STDERR_TAIL_BYTES = 4096
EXIT_POLL_SECONDS = 0.005
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STDERR_TAIL_LINES = 20
MCP_HOST = "127.0.0.1"
MCP_STARTUP_SECONDS = 15.0
MCP_HEALTH_POLL_SECONDS = 0.05
MCP_STOP_GRACE_SECONDS = 2.0
MCP_RESTART_BACKOFF_SECONDS = (1.0, 2.0, 5.0, 15.0, 60.0)
MINIMUM_VERSION = (2, 8)
VERSION_PATTERN = re.compile(r"\bqmd (\d+)\.(\d+)\.(\d+)")


class QmdTimeout(SearchBackendError):
    """A qmd call outlived its timeout and was killed with its process group."""


def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, stdout, stderr,
          die_with_daemon: bool = False) -> subprocess.Popen:
    """Start one qmd child in a session (and process group) of its own; SearchBackendError when it cannot start.
    *die_with_daemon*: the kernel SIGKILLs it when the daemon dies, even by SIGKILL (PR_SET_PDEATHSIG, kept on exec).
    That signal follows the thread that forked, so such children are spawned from the event loop's thread."""
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=dict(env),
                                cwd=cwd, start_new_session=True,
                                preexec_fn=_parent_death_signal(os.getpid()) if die_with_daemon else None)
    except OSError as exc:
        raise SearchBackendError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc


def _parent_death_signal(parent: int) -> Callable[[], None]:
    """A preexec_fn (it runs in the child between fork and exec) that arms PR_SET_PDEATHSIG with SIGKILL."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the daemon died before the signal was armed
            os._exit(1)

    return arm


async def run_qmd(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float,
                  check: bool = False) -> QmdResult:
    """Run one qmd command within *timeout* seconds, killing its process group otherwise. SearchBackendError when
    it cannot start (or, with *check*, exits non-zero); QmdTimeout on timeout."""
    # Output goes to unlinked files: nothing to drain while it runs, and a grandchild holding them blocks nothing.
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = spawn(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
        try:
            if not await exited(process, timeout):
                raise QmdTimeout(f"`{_describe(argv)}` timed out after {timeout:g}s")
        finally:
            # Also reached on cancellation: no qmd process outlives the coroutine that started it.
            kill_group(process)
        stdout.seek(0)
        stderr.seek(0)
        result = QmdResult(process.returncode, stdout.read().decode("utf-8", errors="replace"),
                           stderr.read().decode("utf-8", errors="replace"))
    if check and result.returncode != 0:
        raise SearchBackendError(f"{_describe(argv)} failed: {result.error_text()}")
    return result


async def exited(process: subprocess.Popen, timeout: float | None) -> bool:
    """Wait until *process* has exited, without reaping it (so its group id stays its own); False on timeout."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError:  # no pidfd (a kernel before 5.3, a seccomp filter that refuses it): look every few ms
        deadline = loop.time() + (timeout if timeout is not None else float("inf"))
        while running(process) and loop.time() < deadline:
            await asyncio.sleep(EXIT_POLL_SECONDS)
        return not running(process)
    done = loop.create_future()
    loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
    try:
        await asyncio.wait_for(done, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL everything left in *process*'s group and reap the leader (at once: SIGKILL cannot be ignored)."""
    signal_group(process, signal.SIGKILL)
    process.wait()


def running(process: subprocess.Popen) -> bool:
    """Whether *process* has not exited; unlike poll() it reaps nothing, so its group can still be signalled."""
    if process.returncode is not None:
        return False
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """Send *signum* to *process*'s group while its leader is unreaped (its pid, the group's id, still its own)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


def _describe(argv: Sequence[str]) -> str:
    """`qmd collection show` for `[exe, --index, name, collection, show, ...]`: the command words."""
    words = list(argv[3:] if len(argv) > 2 and argv[1] == "--index" else argv[1:])
    command = list(itertools.takewhile(lambda word: not word.startswith("-"), words[:2]))
    return "qmd " + " ".join(command or words[:1])


@contextlib.asynccontextmanager
async def index_lock(mutex: asyncio.Lock, lock_path: Path, timeout: float) -> AsyncIterator[None]:
    """Exclusive use of a qmd index: *mutex* in this process, an flock on *lock_path* across processes.
    The flock is tried on the loop, not waited for on a thread, so a cancelled wait leaves nothing behind."""
    async with mutex:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with contextlib.ExitStack() as held:
            while True:
                try:
                    held.enter_context(file_lock(lock_path, timeout=0))
                    break
                except LockTimeout as exc:
                    if loop.time() >= deadline:
                        raise SearchBackendError(f"qmd index busy: {lock_path} stayed locked {timeout:g}s") from exc
                except OSError as exc:
                    raise SearchBackendError(f"cannot lock the qmd index: {exc}") from exc
                await asyncio.sleep(FILE_LOCK_POLL_SECONDS)
            yield


def resolve_command(command: str, env: Mapping[str, str]) -> str:
    """The qmd executable *command* names (a path, or a name looked up on *env*'s PATH)."""
    found = shutil.which(os.path.expanduser(command), path=env.get("PATH"))  # a path is checked, not looked up
    if found is None:
        problem = "is not an executable file" if os.sep in command else "not found on PATH"
        raise SearchBackendError(f"qmd command {command!r} {problem} (search.qmd_command)")
    return found


async def check_version(executable: str, *, env: Mapping[str, str], cwd: Path, timeout: float) -> str:
    """The version `qmd --version` reports; SearchBackendError when there is none or it is too old."""
    result = await run_qmd([executable, "--version"], env=env, cwd=cwd, timeout=timeout)
    match = VERSION_PATTERN.search(result.stdout)
    if result.returncode != 0 or match is None:
        raise SearchBackendError(f"`qmd --version` gave no qmd version: {result.error_text()}")
    version = ".".join(match.groups())
    if tuple(int(part) for part in match.groups()[:2]) < MINIMUM_VERSION:
        raise SearchBackendError(f"qmd {version} is too old; need >= {'.'.join(map(str, MINIMUM_VERSION))}")
    return version


def child_environment(home: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of every qmd child: config, index and model cache inside *home*."""
    env = {key: value for key, value in environ.items() if key not in ("INDEX_PATH", "QMD_CONFIG_DIR")}
    env["QMD_CONFIG_DIR"] = str(home / "config")
    env["XDG_CACHE_HOME"] = str(home / "cache")
    env["NO_COLOR"] = "1"
    return env


class McpServer:
    """A lazily started, health-checked `qmd mcp --http` child: the index kept open (seeing other processes'
    updates), no Node start per search. Only a fast path: a failure means the CLI, and a restart with more backoff."""

    def __init__(self, base_argv: Sequence[str], *, env: Mapping[str, str], cwd: Path,
                 clock: Callable[[], float]) -> None:
        self._base_argv = list(base_argv)
        self._env = dict(env)
        self._cwd = cwd
        self._clock = clock
        self._process: subprocess.Popen | None = None
        self._port: int | None = None
        self._starting: asyncio.Task | None = None
        self._stderr_tail = b""
        self._failures = 0
        self._next_start_at = 0.0
        self._closed = False
        self.last_error: str | None = None

    @property
    def ready(self) -> bool:
        """True when the child is running and has answered its health check."""
        return self._port is not None and self._process is not None and running(self._process)

    def ensure_started(self) -> None:
        """Start the child in the background unless it runs, is starting or is backing off."""
        if self._closed or self.ready or (self._starting is not None and not self._starting.done()):
            return
        if self._process is not None:
            # It had answered its health check and died since: a crash loop must back off too.
            process = self._forget_process()
            kill_group(process)  # reap it, and end what it left in its group
            self._note_failure(f"qmd mcp server exited with status {process.returncode}: {self._stderr_text()}")
        if self._clock() < self._next_start_at:
            return
        self._starting = asyncio.ensure_future(self._start())

    async def wait_ready(self, timeout: float = MCP_STARTUP_SECONDS) -> bool:
        """Start the child if needed and wait until it answers (or has failed)."""
        self.ensure_started()
        if self._starting is not None and not self._starting.done():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._starting), timeout)
        return self.ready

    async def post(self, path: str, payload: dict, *, timeout: float) -> dict:
        """POST JSON to the running child, return its JSON answer; SearchBackendError on failure. A connection failure
        marks the child dead (restart with backoff), an HTTP error fails only this request; success resets backoff."""
        if not self.ready:
            raise SearchBackendError("qmd mcp server is not running")
        try:
            status, body = await asyncio.wait_for(asyncio.to_thread(_http_request, self._port, path, payload, timeout),
                                                  timeout)
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            await self._record_failure(f"qmd mcp server did not answer: {exc or type(exc).__name__}")
            raise SearchBackendError(self.last_error) from exc
        if status != 200:
            raise SearchBackendError(f"qmd mcp server answered HTTP {status}: {body[:200]!r}")
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise SearchBackendError(f"qmd mcp server sent bad JSON: {body[:200]!r}") from exc
        if not isinstance(answer, dict):
            raise SearchBackendError(f"qmd mcp server sent {type(answer).__name__}, expected an object")
        self._failures = 0
        return answer

    async def stop(self) -> None:
        """Stop the child (group SIGTERM, SIGKILL after a grace period); ensure_started() makes a new one."""
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        await self._stop_process()

    async def close(self) -> None:
        """Stop the child for good."""
        self._closed = True
        await self.stop()

    async def _start(self) -> None:
        self._port, self._stderr_tail = None, b""
        with socket.socket() as probe:  # a port free a moment ago: qmd's --port has no "pick one" value
            probe.bind((MCP_HOST, 0))
            port = probe.getsockname()[1]
        argv = [*self._base_argv, "mcp", "--http", "--port", str(port), "--host", MCP_HOST]
        try:
            self._process = spawn(argv, env=self._env, cwd=self._cwd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, die_with_daemon=True)
        except SearchBackendError as exc:
            await self._record_failure(f"cannot start qmd mcp server: {exc}")
            return
        # The server logs every request to stderr: keep a short tail for error messages, never a file.
        os.set_blocking(self._process.stderr.fileno(), False)
        asyncio.get_running_loop().add_reader(self._process.stderr.fileno(), self._read_stderr, self._process)
        try:
            await self._wait_healthy(port)
        except asyncio.CancelledError:
            await self._stop_process()
            raise
        except SearchBackendError as exc:
            await self._record_failure(str(exc))
            return
        self._port = port
        logger.info("qmd mcp server ready on {}:{} (pid {})", MCP_HOST, port, self._process.pid)

    async def _wait_healthy(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MCP_STARTUP_SECONDS
        while loop.time() < deadline:
            if not running(self._process):
                kill_group(self._process)
                tail = self._stderr_text() or f"exit status {self._process.returncode}"
                raise SearchBackendError(f"qmd mcp server exited at start: {tail}")
            try:
                status, _ = await asyncio.to_thread(_http_request, port, "/health", None, 1.0)
            except (OSError, http.client.HTTPException):
                status = None
            if status == 200:
                return
            await asyncio.sleep(MCP_HEALTH_POLL_SECONDS)
        raise SearchBackendError(f"qmd mcp server not healthy after {MCP_STARTUP_SECONDS:g}s")

    async def _record_failure(self, reason: str) -> None:
        self._note_failure(reason)
        await self._stop_process()

    def _note_failure(self, reason: str) -> None:
        self.last_error = reason
        delay = MCP_RESTART_BACKOFF_SECONDS[min(self._failures, len(MCP_RESTART_BACKOFF_SECONDS) - 1)]
        self._failures += 1
        self._next_start_at = self._clock() + delay
        logger.warning("{}; using the qmd CLI, next server start in {:g}s", reason, delay)

    async def _stop_process(self) -> None:
        process = self._forget_process()
        if process is None:
            return
        try:
            if process.returncode is None:
                signal_group(process, signal.SIGTERM)
                await exited(process, MCP_STOP_GRACE_SECONDS)
        finally:
            kill_group(process)

    def _forget_process(self) -> subprocess.Popen | None:
        process, self._process, self._port = self._process, None, None
        if process is not None:
            asyncio.get_running_loop().remove_reader(process.stderr.fileno())
            process.stderr.close()
        return process

    def _read_stderr(self, process: subprocess.Popen) -> None:
        try:
            chunk = os.read(process.stderr.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            asyncio.get_running_loop().remove_reader(process.stderr.fileno())
        self._stderr_tail = (self._stderr_tail + chunk)[-STDERR_TAIL_BYTES:]

    def _stderr_text(self) -> str:
        lines = self._stderr_tail.decode("utf-8", errors="replace").splitlines()[-STDERR_TAIL_LINES:]
        return " / ".join(line.rstrip() for line in lines)[-300:]


def _http_request(port: int, path: str, payload: dict | None, timeout: float) -> tuple[int, str]:
    """One blocking request to the child on loopback (run in a thread): POST JSON, or GET without."""
    connection = http.client.HTTPConnection(MCP_HOST, port, timeout=timeout)
    try:
        if payload is None:
            connection.request("GET", path)
        else:
            body = json.dumps(payload).encode("utf-8")
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        connection.close()
