"""`nanobotctl ui` in a real headless Chromium, against a real daemon: read, search, see a dream's diff, undo it.

The browser is Debian's chromium driven by its chromedriver through Selenium; scripts/test.sh installs both.
Screenshots of every page go to tests-output/ui/ (ignored by git).
"""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.llmdaemon import USER, llm_daemon
from tests.support.daemonproc import CTL, REPO
from tests.support.fakellm import FakeLLM, Text, ToolCalls
from tests.support.workspace import conversation, make_workspace, write_session

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = REPO / "tests-output" / "ui"
POLL_SECONDS = 0.05  # how often a wait looks at the page again (selenium's default, 0.5 s, adds up)
FACT = "\n## Infrastructure\n- The backup host is called osprey.\n"


def make_browser(width: int = 1280, height: int = 900, *, javascript: bool = True):
    """A headless Chromium; the test skips, saying why, where none can be had."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver (scripts/test.sh tries)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


@pytest.fixture
def browser():
    driver = make_browser()
    yield driver
    driver.quit()


class PageServer:
    """`nanobotctl ui --no-browser` in a subprocess; url is the one-time link it printed."""

    def __init__(self, daemon) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CTL, "--socket", str(daemon.socket), "ui", "--no-browser"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=\S+", line)
        assert match, line + self.proc.stdout.read()
        self.url, self.port = match.group(0), int(match.group(1))
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def page_server():
    made: list[PageServer] = []

    def start(daemon) -> PageServer:
        made.append(PageServer(daemon))
        return made[-1]

    yield start
    for server in made:
        server.stop()


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def wait_run(daemon, run_id: str) -> dict:
    return daemon.wait_for(lambda: (lambda run: run if run["state"] not in ("queued", "started") else None)(
        daemon.ctl_json("run", run_id)["run"]), timeout=60)


def shot(driver, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def text_of(driver) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def waiting(driver, timeout: float) -> WebDriverWait:
    """A wait on the page that looks again every POLL_SECONDS."""
    return WebDriverWait(driver, timeout, poll_frequency=POLL_SECONDS)


def after_click(driver, element_id: str, wanted_id: str, timeout: float = 90):
    """Click a button and wait for the page it leads to: the element *wanted_id*, or a refusal to show."""
    driver.find_element(By.ID, element_id).click()
    try:
        return waiting(driver, timeout).until(lambda browser: browser.find_element(By.ID, wanted_id))
    except Exception as exc:
        page = text_of(driver)
        raise AssertionError(f"no #{wanted_id} after clicking #{element_id}; the page says:\n{page}") from exc


def remembered_and_dreamt(daemon, fake) -> str:
    """A session archived, a fact in MEMORY.md the index found, and a dream that changed USER.md: its run id."""
    write_session(daemon.sessions, "cli:alice", conversation(6))
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:alice"))
    fake.push(Text("- [correction] The user prefers coffee, not tea"))
    assert daemon.ctl("consolidate", "cli:alice", "--wait").returncode == 0
    memory = daemon.workspace / "memory" / "MEMORY.md"
    memory.write_text(memory.read_text() + FACT)
    daemon.ctl("reindex")
    daemon.wait_for(lambda: daemon.ctl_json("search", "osprey backup host")["hits"], timeout=20)
    fake.push(Text("[USER] correction: prefers coffee, not tea"),
              ToolCalls([("edit_file", {"path": "USER.md",
                                        "edits": [{"old_text": "- Likes tea.", "new_text": "- Likes coffee."}]})]),
              Text("done"))
    dream = daemon.ctl_json("dream")["run_id"]
    assert wait_run(daemon, dream)["state"] == "finished"
    assert "Likes coffee" in (daemon.workspace / "USER.md").read_text()
    return dream


def test_the_page_shows_memory_and_a_dream_diff_and_undoes_the_dream(tmp_path, fake, daemon_process, page_server,
                                                                      browser) -> None:
    daemon = llm_daemon(tmp_path, fake, daemon_process)
    dream = remembered_and_dreamt(daemon, fake)
    page = page_server(daemon)

    browser.get(page.url)
    assert browser.current_url == page.base + "/"  # the token was swapped for a cookie and left the address bar
    assert "cli:alice" in browser.find_element(By.CSS_SELECTOR, "table.sessions").text
    assert "Workspace ws" in text_of(browser) and "Next dream" in text_of(browser)
    shot(browser, "overview")

    browser.find_element(By.LINK_TEXT, "Memory").click()
    assert "memory/MEMORY.md" in text_of(browser) and "Likes coffee." in text_of(browser)
    field = browser.find_element(By.ID, "q")
    field.send_keys("osprey backup host")
    field.submit()
    hits = waiting(browser, 30).until(lambda driver: driver.find_element(By.CSS_SELECTOR, "ol.hits")).text
    assert "memory/MEMORY.md" in hits and "osprey" in hits
    assert browser.find_element(By.CSS_SELECTOR, "ol.hits .label").text == "memory"
    shot(browser, "memory")

    browser.find_element(By.LINK_TEXT, "Runs").click()
    shot(browser, "runs")
    browser.find_element(By.PARTIAL_LINK_TEXT, dream).click()
    added = [line.text for line in browser.find_elements(By.CSS_SELECTOR, ".diff .d-add")]
    removed = [line.text for line in browser.find_elements(By.CSS_SELECTOR, ".diff .d-del")]
    assert "+- Likes coffee." in added and "-- Likes tea." in removed
    shot(browser, "dream-diff")

    assert after_click(browser, "preview", "plan").text.strip()
    assert "Likes coffee" in (daemon.workspace / "USER.md").read_text()  # a preview changes nothing
    shot(browser, "restore-preview")
    browser.find_element(By.ID, "restore").click()
    waiting(browser, 10).until(expected_conditions.alert_is_present()).accept()
    result = waiting(browser, 90).until(lambda driver: driver.find_element(By.ID, "restored"))
    assert "Restore done" in result.text
    assert (daemon.workspace / "USER.md").read_text() == USER
    shot(browser, "restore-done")

    browser.find_element(By.LINK_TEXT, "Health").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "figure svg")) == 6
    assert browser.find_elements(By.CSS_SELECTOR, "figure svg rect")  # the consolidation and the dream drawn
    # the daemon sampled today's index size after its refresh: today's column of the index chart is drawn
    index_chart = next(figure for figure in browser.find_elements(By.TAG_NAME, "figure")
                       if figure.find_element(By.TAG_NAME, "h2").text == "Search index size")
    today = index_chart.find_elements(By.CSS_SELECTOR, ".axis-days span")[-1].text
    drawn = [title.get_attribute("textContent") for title in index_chart.find_elements(By.CSS_SELECTOR, "rect title")]
    assert any(text.startswith(f"{today}: ") and " units (" in text for text in drawn), drawn
    shot(browser, "health")
    browser.set_window_size(390, 844)
    browser.get(page.base + "/")
    shot(browser, "overview-phone")


def refused(request: urllib.request.Request) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class EvilSite:
    """A page of another origin that posts a restore form to the UI as soon as it loads."""

    def __init__(self, target: str) -> None:
        html = (f'<form id="f" method="post" action="{target}"><input name="csrf" value="guess"></form>'
                '<script>document.getElementById("f").submit()</script>').encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(html)

            def log_message(self, *args) -> None:
                pass

        # threads: Chromium opens spare connections that send nothing, which would hold a single-threaded server
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_without_the_token_or_from_another_origin_nothing_is_served_or_changed(tmp_path, daemon_process,
                                                                               page_server, browser) -> None:
    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, "cli:bob", conversation(6))
    daemon = daemon_process(workspace)
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:bob"))
    consolidated = daemon.ctl_json("consolidate", "cli:bob")
    assert wait_run(daemon, consolidated["run_id"])["state"] == "finished"
    history = (workspace / "memory" / "history.jsonl").read_bytes()
    page = page_server(daemon)
    restore_url = f"{page.base}/runs/{consolidated['run_id']}/restore"

    for path in ("/", "/memory", "/static/style.css", "/?token=wrong"):
        status, body = refused(urllib.request.Request(page.base + path))
        assert status == 403 and "Refused" in body, path
    browser.get(page.base + "/")
    assert "Refused" in text_of(browser) and "cli:bob" not in text_of(browser)
    shot(browser, "refused")

    browser.get(page.url)
    assert "cli:bob" in text_of(browser)
    assert refused(urllib.request.Request(page.url))[0] == 403  # the link is spent once a browser used it
    cookie = {item["name"]: item for item in browser.get_cookies()}[f"nanobotd_ui_{page.port}"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    browser.get(f"{page.base}/runs/{consolidated['run_id']}")
    csrf = browser.find_element(By.NAME, "csrf").get_attribute("value")

    evil = EvilSite(restore_url)
    try:
        browser.get(evil.url)
        waiting(browser, 10).until(lambda driver: driver.current_url.startswith(page.base))
        assert "Refused" in text_of(browser)
    finally:
        evil.server.shutdown()

    def post(path: str, origin: str, host: str = f"127.0.0.1:{page.port}") -> tuple[int, str]:
        return refused(urllib.request.Request(page.base + path, data=f"csrf={csrf}".encode(), method="POST", headers={
            "Cookie": f"{cookie['name']}={cookie['value']}", "Origin": origin, "Host": host,
            "Content-Type": "application/x-www-form-urlencoded"}))

    assert post(f"/runs/{consolidated['run_id']}/restore", evil.url.rstrip("/"))[0] == 403
    assert post(f"/runs/{consolidated['run_id']}/restore", "http://evil.example", host="evil.example")[0] == 403
    assert (workspace / "memory" / "history.jsonl").read_bytes() == history
    assert not [run for run in daemon.ctl_json("runs", "--all")["runs"] if run["kind"] == "restore"]
    status, body = post(f"/runs/{consolidated['run_id']}/preview", page.base)
    assert status == 200 and 'id="plan"' in body  # the same request from the page's own origin is served


def test_with_javascript_off_the_pages_read_search_and_undo_a_consolidation(tmp_path, daemon_process,
                                                                            page_server) -> None:
    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, "cli:carol", conversation(6))
    daemon = daemon_process(workspace)
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:carol"))
    history = workspace / "memory" / "history.jsonl"
    before = history.read_bytes() if history.exists() else b""
    consolidated = daemon.ctl_json("consolidate", "cli:carol")["run_id"]
    assert wait_run(daemon, consolidated)["state"] == "finished" and history.read_bytes() != before
    page = page_server(daemon)
    driver = make_browser(javascript=False)
    try:
        driver.get(page.url)
        assert "cli:carol" in driver.find_element(By.CSS_SELECTOR, "table.sessions").text
        driver.get(page.base + "/memory")
        timeline = driver.find_element(By.CSS_SELECTOR, "ol.timeline").text
        assert "cli:carol" in timeline  # the raw archive entry, on the history timeline
        driver.get(f"{page.base}/runs/{consolidated}")
        assert after_click(driver, "preview", "plan").text.strip()
        result = after_click(driver, "restore", "restored")  # no script, so no confirmation: the form posts
        assert "Restore done" in result.text
        shot(driver, "restore-done-without-javascript")
    finally:
        driver.quit()
    assert history.read_bytes() == before
