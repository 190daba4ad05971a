"""Page load of `nanobotctl ui` for a large workspace: 1,000 sessions and 100,000 history entries.

Starts a real daemon (offline) on a generated workspace, waits until it has reconciled every session and
indexed its memory, starts `nanobotctl ui --no-browser`, logs in with the printed link, then fetches each page
--rounds times and prints the median and p95 of the time to the last byte of the HTML. With --browser, it also
loads the overview in headless Chromium and prints the browser's own load time (navigation to load event).
Goal: under 300 ms a page.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.daemonproc import CTL, REPO, DaemonProcess  # noqa: E402
from tests.support.workspace import conversation, make_workspace, write_session  # noqa: E402

GOAL_MS = 300.0
# "{n}": a new query each round, so no answer comes from a cache
PAGES = ("/", "/memory", "/memory?q=backup+host+osprey", "/memory?q=project+{n}+words", "/runs", "/health")
START = datetime(2026, 5, 1, 8, 0)


def write_history(memory: Path, count: int) -> None:
    """*count* entries of ~300 characters, spread over the days up to now (about 500 a day)."""
    step = (datetime.now() - START) / count
    with open(memory / "history.jsonl", "w", encoding="utf-8") as out:
        for cursor in range(1, count + 1):
            stamp = (START + step * cursor).strftime("%Y-%m-%d %H:%M")
            content = f"[RAW] entry {cursor}: the user talked about project {cursor % 97} " + "and more words " * 16
            out.write(json.dumps({"cursor": cursor, "timestamp": stamp, "content": content,
                                  "session_key": f"cli:s{cursor % 1000}"}) + "\n")


def build_workspace(root: Path, sessions_count: int, entries: int) -> tuple[Path, Path]:
    workspace, sessions = make_workspace(root, layout="current")
    for number in range(sessions_count):
        write_session(sessions, f"cli:s{number}", conversation(8 + number % 12, tag=f"s{number}", words=12))
    memory = workspace / "memory"
    (memory / "MEMORY.md").write_text("# Memory\n\n## Infrastructure\n- The backup host is called osprey.\n"
                                      + "".join(f"- fact {index} about the user's projects\n" for index in range(200)))
    for offset in range(30):
        day = (datetime.now() - timedelta(days=offset)).date()
        (memory / f"{day}.md").write_text(f"# {day}\n\n## Topics\n- talked about project {offset}\n")
    write_history(memory, entries)
    return workspace, sessions


def start_page(daemon: DaemonProcess) -> tuple[subprocess.Popen, str]:
    """A `nanobotctl ui` and its one-time link."""
    ui = subprocess.Popen([sys.executable, "-c", CTL, "--socket", str(daemon.socket), "ui", "--no-browser"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    return ui, re.search(r"http://\S+", ui.stdout.readline()).group(0)


def wait_settled(daemon: DaemonProcess, sessions_count: int, timeout: float) -> float:
    started = time.monotonic()

    def settled():
        workspace = daemon.ctl_json("status")["workspaces"][0]
        search = workspace["search"]
        done = (not workspace["scanning"] and workspace["sessions_watched"] >= sessions_count
                and search["refreshes"] >= 1 and not search["refreshing"] and not search["pending_changes"])
        return workspace if done else None

    daemon.wait_for(settled, timeout=timeout, interval=1.0)
    return time.monotonic() - started


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round((len(ordered) - 1) * fraction))]


def time_pages(base: str, opener, rounds: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {}
    for page in PAGES:
        for _ in range(2):  # warm-up: the first search and the first template compile
            opener.open(base + page.format(n=999)).read()
        for round_number in range(rounds):
            started = time.perf_counter()
            with opener.open(base + page.format(n=round_number)) as answer:
                answer.read()
                assert answer.status == 200
            timings.setdefault(page, []).append((time.perf_counter() - started) * 1000)
    return timings


def browser_load_ms(url: str, base: str, rounds: int) -> list[float]:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(
        executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver"))
    try:
        driver.get(url)
        loads = []
        for _ in range(rounds):
            driver.get(base + "/")
            loads.append(driver.execute_script(
                "const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime;"))
        return loads
    finally:
        driver.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--browser", action="store_true", help="also time the overview's load in headless Chromium")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nbui-"))
    daemon = ui = None
    try:
        built = time.monotonic()
        workspace, _ = build_workspace(root, args.sessions, args.entries)
        print(f"workspace: {args.sessions} sessions, {args.entries:,} history entries "
              f"({(workspace / 'memory' / 'history.jsonl').stat().st_size / 1e6:.1f} MB) in "
              f"{time.monotonic() - built:.1f} s")
        daemon = DaemonProcess(root, workspace).start()
        print(f"daemon settled in {wait_settled(daemon, args.sessions, 600):.1f} s")
        ui, url = start_page(daemon)
        base = url.split("/?", 1)[0]
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        opener.open(url).read()
        timings = time_pages(base, opener, args.rounds)
        print(f"{'page':34} {'median ms':>10} {'p95 ms':>8}   (goal < {GOAL_MS:.0f} ms)")
        for page, values in timings.items():
            print(f"{page:34} {statistics.median(values):10.1f} {percentile(values, 0.95):8.1f}")
        if args.browser:
            second, browser_url = start_page(daemon)  # the browser logs in with a link of its own
            try:
                loads = browser_load_ms(browser_url, browser_url.split("/?", 1)[0], args.rounds)
            finally:
                second.terminate()
            print(f"{'/ in headless Chromium (load event)':34} {statistics.median(loads):10.1f} "
                  f"{percentile(loads, 0.95):8.1f}")
        worst = max(percentile(values, 0.95) for values in timings.values())
        print(f"worst p95: {worst:.1f} ms -> {'ok' if worst < GOAL_MS else 'over the goal'}")
        return 0 if worst < GOAL_MS else 1
    finally:
        if ui is not None:
            ui.terminate()
        if daemon is not None:
            daemon.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
