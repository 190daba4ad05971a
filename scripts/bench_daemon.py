"""A real `nanobotd run` under measurement: /proc readers and a daemon with the documented defaults.

Shared by the benchmarks so every figure about a daemon is read the same way: CPU from /proc/<pid>/stat,
memory from /proc/<pid>/status (the daemon alone, and with its children such as the LLM worker), imported
libraries from /proc/<pid>/maps, and the daemon's own view over its control socket.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanobotd.cli.client import CannotConnect, Client, DaemonError  # noqa: E402
from tests.support.daemonproc import DaemonProcess  # noqa: E402
from tests.support.observe import child_pids, cpu_seconds, stat_fields  # noqa: E402

SETTLE_TIMEOUT_SECONDS = 1800.0
QUIET_CPU_SECONDS = 0.02
RECONCILE_LOGGED = "start-up reconcile of"  # the daemon's log line at the end of its start-up reconcile
# litellm drags in these compiled modules; nothing else the daemon imports does (Python files are read,
# not mapped, so litellm's own package never shows in /proc/<pid>/maps).
# -- /proc readers ---------------------------------------------------------------------------------------
def memory_mb(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MB (zeros for a process that is gone)."""
    values = {"VmRSS": 0.0, "VmHWM": 0.0}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                if name in values:
                    values[name] = int(rest.split()[0]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return values


def tree_memory_mb(pid: int) -> dict:
    """VmRSS of *pid* and of each of its children: what running the daemon costs the machine now."""
    own = memory_mb(pid)["VmRSS"]
    children = {child: memory_mb(child)["VmRSS"] for child in child_pids(pid)}
    return {"daemon_mb": round(own, 1), "children_mb": {str(child): round(rss, 1) for child, rss in children.items()},
            "total_mb": round(own + sum(children.values()), 1)}


def private_mb(pid: int) -> float:
    """The memory only this process holds, in MB (Private_Clean + Private_Dirty): what it adds beside its
    parent (a child forked before its exec shares all its parent's pages, which its RSS would count again)."""
    found = 0.0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    found += int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return found


class TreePeak:
    """The most memory a process and its children held at once (its RSS and their private memory), sampled
    every *interval* s while in use: what the machine gave them together (their VmHWMs summed add peaks that
    may never have met)."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid, self.interval, self.peak_mb = pid, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="tree-peak", daemon=True)

    def start(self) -> TreePeak:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> TreePeak:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = memory_mb(self.pid)["VmRSS"] + sum(private_mb(child) for child in listed_children(self.pid)
                                                       if not _before_exec(child))
            self.peak_mb = max(self.peak_mb, total)
            self._stop.wait(self.interval)


PF_FORKNOEXEC = 0x40  # the kernel's task flag of a process forked that has not exec'd yet


def _before_exec(pid: int) -> bool:
    """A child between its (v)fork and its exec: after a vfork it runs in its parent's address space, whose
    pages all count as its private memory (a whole second daemon, for a few ms), so it is left out. The
    daemon's children all exec (a process forked to work without exec would be left out too)."""
    try:
        flags = int(stat_fields(pid)[6])
    except (OSError, IndexError, ValueError):
        return False
    return bool(flags & PF_FORKNOEXEC)


def listed_children(pid: int) -> list[int]:
    """The children the kernel lists for each of *pid*'s threads (one small read a thread), or child_pids' scan
    of every process where it lists none: a sample every 20 ms must cost next to nothing (the scan of /proc
    takes ~1 ms of a core, and of the GIL where the sampled process samples itself)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: set[int] = set()
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children") as handle:
                children.update(int(child) for child in handle.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile, or a kernel without the file
            if not os.path.exists(f"/proc/{pid}/task/{threads[0]}/children"):
                return child_pids(pid)
        except OSError:
            continue
    return sorted(children)


def children_hwm_mb(pid: int) -> float:
    """The peak RSS (VmHWM) of *pid*'s children alive now, summed: what a daemon's children cost
    beside the daemon (its own VmHWM leaves it out)."""
    return round(sum(memory_mb(child)["VmHWM"] for child in child_pids(pid)), 1)


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def verdict(ok: bool) -> str:
    """PASS or FAIL against a target."""
    return "PASS" if ok else "FAIL"


def save_figures(path: Path | None, figures: dict) -> None:
    """Write a benchmark's *figures* as JSON to *path* (its --json), when one was given."""
    if path is not None:
        path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"\nfigures written to {path}")


# -- a daemon with the default [daemon] settings ----------------------------------------------------------
class BenchDaemon(DaemonProcess):
    """`nanobotd run` with the documented [daemon] defaults (debounce, reconcile period, INFO logging)."""

    def __init__(self, folder: Path, workspace: Path, sessions_dir: Path, *, state_dir: Path | None = None,
                 extra_tables: str = "", workspace_lines: str = ""):
        home = folder / "home"
        runtime = folder / "run"
        for path in (home, runtime):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        environment = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                       "XDG_STATE_HOME": str(home / ".state"), "XDG_RUNTIME_DIR": str(runtime)}
        super().__init__(folder, workspace, sessions_dir=sessions_dir, env=environment)
        for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC", "INVOCATION_ID"):
            self.env.pop(name, None)
        if state_dir is not None:
            self.state_dir = state_dir
        self.config_path.write_text(
            f'[daemon]\nsocket = "{self.socket}"\nstate_dir = "{self.state_dir}"\nlog_level = "INFO"\n'
            f"{extra_tables}\n"
            f'[[workspaces]]\npath = "{workspace}"\nname = "ws"\nsessions_dir = "{sessions_dir}"\n'
            f"{workspace_lines}")
        self.client = Client(self.socket, timeout=600)
        self.slowest_status_seconds = 0.0
        self.poll_errors: list[str] = []

    def status(self) -> dict | None:
        """GET /v1/status, or None while nothing answers; remembers the slowest answer (a blocked loop)."""
        asked = time.monotonic()
        answer = self.poll("/v1/status")
        if answer is not None:
            self.slowest_status_seconds = max(self.slowest_status_seconds, time.monotonic() - asked)
        return answer

    def poll(self, path: str, query: dict | None = None) -> dict | None:
        """GET *path*, or None when the daemon cannot be reached or answers an error (noted in poll_errors)."""
        try:
            return self.client.get(path, query)
        except CannotConnect:
            return None
        except DaemonError as error:
            self.poll_errors.append(f"{path}: {error}")
            return None

    def wait_settled(self, sessions: int, timeout: float = SETTLE_TIMEOUT_SECONDS) -> float:
        """Until the start-up reconcile, the first index refresh and all jobs are done and CPU is quiet."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self.check_alive()
            status = self.status()
            if status and settled(status, sessions):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"daemon did not settle in {timeout}s:\n{self.log()[-3000:]}")
        while time.monotonic() - started < timeout:
            before = cpu_seconds(self.proc.pid)[0]
            time.sleep(1.0)
            if cpu_seconds(self.proc.pid)[0] - before < QUIET_CPU_SECONDS:
                break
        return time.monotonic() - started

    def wait_reconciled(self, sessions: int, started: float, timeout: float = SETTLE_TIMEOUT_SECONDS, *,
                        poll: float = 0.05, by_log: bool = False) -> float:
        """Seconds from *started* (monotonic) until status shows the start-up reconcile of *sessions* done, status
        asked every *poll* seconds. *by_log*: until the daemon logged that reconcile's end (to the millisecond), so a
        slow poll neither adds its wait to the figure nor takes, with every answer, the daemon's GIL from the
        reconcile it measures."""
        wall_started = time.time() - (time.monotonic() - started)
        while time.monotonic() - started < timeout:
            self.check_alive()
            status = self.status()
            workspace = status["workspaces"][0] if status else {}
            if workspace.get("last_reconcile") is not None and workspace.get("sessions_watched") == sessions:
                if not by_log:
                    return time.monotonic() - started
                logged = self.logged_at(RECONCILE_LOGGED)
                if logged is not None:
                    return logged - wall_started
            time.sleep(poll)
        raise RuntimeError(f"daemon never reported a reconcile of {sessions} sessions:\n{self.log()[-3000:]}")

    def logged_at(self, text: str) -> float | None:
        """When the daemon first logged a line with *text* (seconds since the epoch), None before it did."""
        for line in self.log().splitlines():
            if text in line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
                return stamp.timestamp()
        return None

    def check_alive(self) -> None:
        """Raise with the log's tail when the daemon has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()[-3000:]}")


def settled(status: dict, sessions: int) -> bool:
    """Start-up reconcile done, every session watched, the index refreshed, no job running."""
    workspace = status["workspaces"][0]
    search = workspace.get("search") or {}
    return (workspace.get("last_reconcile") is not None and workspace.get("sessions_watched") == sessions
            and search.get("last_refresh") is not None and not search.get("pending_changes")
            and not status.get("jobs_running"))
