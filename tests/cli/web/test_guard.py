"""nanobotd/cli/web/guard.py: the token, the cookie, the Host and the same-origin check, in front of a tiny app."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from nanobotd.cli.web.guard import Guard, Secrets

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture
def keys() -> Secrets:
    return Secrets(PORT)


@pytest.fixture
def client(keys: Secrets) -> TestClient:
    async def show(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"page {request.url.path}")

    async def change(request: Request) -> PlainTextResponse:
        form = await request.form()  # the page reads the body the guard already read
        return PlainTextResponse(f"changed {form.get('what')}")

    app = Starlette(routes=[Route("/", show), Route("/memory", show), Route("/change", change, methods=["POST"])])
    return TestClient(Guard(app, keys), base_url=BASE, follow_redirects=False)


def signed_in(client: TestClient, keys: Secrets) -> TestClient:
    answer = client.get(f"/memory?token={keys.token}&day=2026-11-20")
    assert answer.status_code == 303 and answer.headers["location"] == "/memory?day=2026-11-20"
    cookie = answer.headers["set-cookie"]
    assert f"nanobotd_ui_{PORT}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    return client


def test_nothing_is_served_without_the_token(client: TestClient) -> None:
    for path in ("/", "/memory", "/?token=wrong"):
        answer = client.get(path)
        assert answer.status_code == 403 and "nanobotctl ui" in answer.text


def test_the_token_logs_in_once_and_the_cookie_serves_every_page(client: TestClient, keys: Secrets) -> None:
    signed_in(client, keys)
    assert client.get("/").text == "page /"
    stranger = TestClient(client.app, base_url=BASE, follow_redirects=False)
    assert stranger.get(f"/?token={keys.token}").status_code == 403  # spent


def test_another_host_name_is_refused_even_with_the_cookie(client: TestClient, keys: Secrets) -> None:
    signed_in(client, keys)
    assert client.get("/", headers={"Host": f"rebound.example:{PORT}"}).status_code == 403
    assert client.get("/", headers={"Host": f"localhost:{PORT}"}).status_code == 200  # an SSH forward


@pytest.mark.parametrize("headers, csrf, allowed", [
    ({"Origin": BASE}, "right", True),
    ({"Referer": f"{BASE}/runs/r-1"}, "right", True),
    ({"Origin": "http://127.0.0.1:9999"}, "right", False),
    ({"Origin": "null"}, "right", False),
    ({}, "right", False),
    ({"Origin": BASE}, "wrong", False),
    ({"Origin": BASE}, "", False),
])
def test_a_change_needs_the_same_origin_and_the_csrf_field(client: TestClient, keys: Secrets, headers: dict,
                                                           csrf: str, allowed: bool) -> None:
    signed_in(client, keys)
    value = keys.csrf if csrf == "right" else csrf
    answer = client.post("/change", data={"csrf": value, "what": "x"}, headers=headers)
    assert (answer.status_code, answer.text) == ((200, "changed x") if allowed else (403, answer.text))


def test_a_change_without_the_cookie_is_refused(client: TestClient, keys: Secrets) -> None:
    answer = client.post("/change", data={"csrf": keys.csrf}, headers={"Origin": BASE})
    assert answer.status_code == 403


def test_a_body_is_not_read_before_the_cookie_and_a_large_one_is_refused(client: TestClient, keys: Secrets) -> None:
    big = {"csrf": keys.csrf, "what": "x" * 20_000}
    assert client.post("/change", data=big, headers={"Origin": BASE}).status_code == 403  # no cookie yet
    signed_in(client, keys)
    assert client.post("/change", data=big, headers={"Origin": BASE}).status_code == 413
