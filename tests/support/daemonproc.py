"""Run a real nanobotd subprocess on a tmp workspace and talk to it with nanobotctl."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

from nanobotd.cli.client import CannotConnect, Client, DaemonError
from nanobotd.cli.nanobotctl import main as nanobotctl_main

REPO = Path(__file__).resolve().parents[2]
CTL = "import sys; from nanobotd.cli.nanobotctl import main; sys.exit(main())"
# A daemon's first LLM call starts its LLM worker, which imports litellm: ~2.5 s here, 15 s and more when the
# 2-core machine is loaded; a wait for the first call's effects allows for that.
FIRST_LLM_CALL_SECONDS = 60


class DaemonProcess:
    """`nanobotd run` in a subprocess with its own config, state dir and socket.

    The test files are written as nanobot 0.3.5 writes them (with `last_archived`), which "auto" would take
    for an agent that archives by itself; scenarios of nanobotd archiving say `mode="owner"` (the default here).
    """

    def __init__(self, tmp_path: Path, workspace: Path, *, sessions_dir: Path | None = None,
                 extra_config: str = "", env: dict | None = None, args: tuple[str, ...] = (),
                 mode: str = "owner", reconcile_seconds: float = 2, default_config: bool = False):
        """*default_config*: the config is written where nanobotd looks without --config
        ($XDG_CONFIG_HOME/nanobotd/config.toml) and the daemon is started without the flag."""
        self.tmp_path = tmp_path
        self.socket = tmp_path / "sock" / "nanobotd.sock"
        self.state_dir = tmp_path / "state"
        self.config_path = (tmp_path / "xdg" / "nanobotd" / "config.toml" if default_config
                            else tmp_path / "nanobotd.toml")
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = tmp_path / "daemon.log"
        sessions_line = f'sessions_dir = "{sessions_dir}"' if sessions_dir else ""
        self.config_path.write_text(f"""
[daemon]
socket = "{self.socket}"
state_dir = "{self.state_dir}"
reconcile_seconds = {reconcile_seconds}
debounce_seconds = 0.2
log_level = "DEBUG"
{extra_config}

[[workspaces]]
path = "{workspace}"
name = "ws"
consolidation = {{ mode = "{mode}" }}
{sessions_line}
""")
        self.env = dict(os.environ, **(env or {}))
        if default_config:
            self.env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
        self.config_args = () if default_config else ("--config", str(self.config_path))
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self, *, wait: bool = True) -> DaemonProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "nanobotd.cli.nanobotd", "run", *self.config_args,
                                      *self.args],
                                     stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            if self.socket.exists() and self.api("/v1/status") is not None:
                return
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready:\n{self.log()}")

    def wait_reconciled(self, starts: int = 1) -> None:
        """Wait for the start-up reconcile of the daemon's *starts*-th start (its log says so, and so says the log
        file kept across restarts): the API answers before it, the session folders are watched from its end on."""
        self.wait_for(lambda: self.log().count("start-up reconcile of") >= starts)

    def api(self, path: str, timeout: float = 30) -> dict | None:
        """GET *path* from the control API; None while nothing answers or on an error answer."""
        try:
            return Client(self.socket, timeout).get(path)
        except (CannotConnect, DaemonError):
            return None

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`nanobotctl --socket S ARGS`: nanobotctl's own entry point, run in this process (a subprocess per call
        cost ~0.4 s of start-up on a loaded machine; tests of the console script itself use tests/e2e/cli.py)."""
        argv = ["--socket", str(self.socket), *args]
        out, err, ended = io.StringIO(), io.StringIO(), []

        def run() -> None:
            try:
                ended.append(nanobotctl_main(argv, stdout=out, stderr=err))
            except BaseException as exc:  # handed to the test's thread, which raises it
                ended.append(exc)

        runner = threading.Thread(target=run, name="nanobotctl", daemon=True)
        runner.start()
        runner.join(timeout)
        if not ended:
            raise subprocess.TimeoutExpired(["nanobotctl", *argv], timeout, out.getvalue(), err.getvalue())
        if isinstance(ended[0], BaseException):
            raise ended[0]
        return subprocess.CompletedProcess(["nanobotctl", *argv], ended[0], out.getvalue(), err.getvalue())

    def ctl_json(self, *args: str) -> dict:
        proc = self.ctl("--json", *args)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def wait_for(self, predicate, timeout: float = 20, interval: float = 0.05):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"condition not met in {timeout}s (last: {last!r})\n{self.log()[-3000:]}")

    def session(self, key: str) -> dict | None:
        answer = self.api(f"/v1/sessions/{quote(key, safe='')}")
        return answer["session"] if answer is not None else None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# what tests/conftest.py's isolated_paths takes out of a test's environment
UNSHARED_ENV = ("STATE_DIRECTORY", "RUNTIME_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC", "INVOCATION_ID",
                "NANOBOTD_SOCKET")


def shared_daemon(tmp_path: Path, workspace: Path, **kwargs) -> DaemonProcess:
    """A daemon (not started) for a module-scoped fixture, the tests of one file sharing it: started before any
    test's own paths are set, so it gets its own HOME, XDG folders and runtime folder under *tmp_path*."""
    home, runtime = tmp_path / "home", tmp_path / "run"
    home.mkdir(exist_ok=True)
    runtime.mkdir(mode=0o700, exist_ok=True)
    proc = DaemonProcess(tmp_path, workspace, **kwargs)
    for name in UNSHARED_ENV:
        proc.env.pop(name, None)
    proc.env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_STATE_HOME=str(home / ".state"),
                    XDG_RUNTIME_DIR=str(runtime))
    return proc
