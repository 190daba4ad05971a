"""Who may use the web page: the holder of the one-time token nanobotctl ui printed, from this machine's address.

The page can undo runs, so it is guarded like a local admin page:
- the Host header must name the loopback address and port served (a DNS-rebinding page names its own host);
- the URL's one-time token becomes an HttpOnly, SameSite=Strict cookie and a redirect to the clean URL (no token
  left in the address bar or history); nothing is served without the cookie;
- a POST also needs the form's CSRF field and an Origin (or Referer) of the served host and port, else 403."""

from __future__ import annotations

import hmac
import secrets
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_PARAM = "token"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SAFE_METHODS = ("GET", "HEAD")
MAX_FORM_BYTES = 16 * 1024
REFUSED = ("open the address `nanobotctl ui` printed (its one-time token logs this browser in), or run "
           "`nanobotctl ui` again for a new one.")


@dataclass
class Secrets:
    """The one-time URL token, the session cookie's value and the CSRF field's value of one `nanobotctl ui`."""

    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    session: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    _used: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cookie_name(self) -> str:
        """Cookies are not kept apart by port, so two `nanobotctl ui` on one machine each name their own."""
        return f"nanobotd_ui_{self.port}"

    def take_token(self, offered: str) -> bool:
        """True once for the right token; it logs in one browser, then is spent."""
        with self._lock:
            if self._used or not _same(offered, self.token):
                return False
            self._used = True
            return True

    def signed_in(self, request: Request) -> bool:
        """The request carries this server's session cookie."""
        return _same(request.cookies.get(self.cookie_name, ""), self.session)


class Guard:
    """ASGI middleware in front of every page and file of the web UI."""

    def __init__(self, app: ASGIApp, keys: Secrets) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        body = b""
        refusal = self.refusal(request)
        if refusal is None and request.method not in SAFE_METHODS:
            body = await read_form(request)
            refusal = self.change_refusal(request, body)
        if refusal is not None:
            await refusal(scope, receive, send)
            return

        async def replay() -> dict:
            # the guard has read the body; the page reads the same bytes again
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay if body else receive, send)

    def refusal(self, request: Request) -> Response | None:
        """The answer that refuses *request* (another Host, no cookie), a redirect that logs it in, or None."""
        # the Host names the served address (or an SSH forward of the same port)
        if request.headers.get("host", "") not in {f"{name}:{self.keys.port}" for name in LOOPBACK_NAMES}:
            return refuse(f"this page is served as http://127.0.0.1:{self.keys.port}/ only.")
        if TOKEN_PARAM in request.query_params:
            return self.sign_in(request)
        return None if self.keys.signed_in(request) else refuse(REFUSED)

    def change_refusal(self, request: Request, body: bytes | None) -> Response | None:
        """For a signed-in POST: refused unless it is of the page's own origin and carries the CSRF field."""
        if body is None:
            return refuse("a form of this page is small; this request is not.", 413)
        if not same_origin(request):
            return refuse("a change must come from this page itself (Origin differs).")
        if not _same(parse_qs(body.decode("utf-8", "replace")).get(CSRF_FIELD, [""])[0], self.keys.csrf):
            return refuse("the form's CSRF field is missing or stale; reload the page.")
        return None

    def sign_in(self, request: Request) -> Response:
        if not self.keys.take_token(request.query_params[TOKEN_PARAM]):
            return refuse(REFUSED)
        query = urlencode([(name, value) for name, value in request.query_params.multi_items()
                           if name != TOKEN_PARAM])
        response = RedirectResponse(request.url.path + (f"?{query}" if query else ""), status_code=303)
        response.set_cookie(self.keys.cookie_name, self.keys.session, httponly=True, samesite="strict", path="/")
        return response


def refuse(reason: str, status_code: int = 403) -> Response:
    """A plain-text refusal that says why and what to do."""
    return PlainTextResponse(f"Refused: {reason}\n", status_code=status_code)


def _same(offered: str, secret: str) -> bool:
    # compare_digest takes as long whatever the offered value, so its timing tells nothing of the secret
    return hmac.compare_digest(offered.encode(), secret.encode())


async def read_form(request: Request) -> bytes | None:
    """The body of a form post, or None past MAX_FORM_BYTES (the page's forms hold a CSRF field, no more)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    return body


def same_origin(request: Request) -> bool:
    """Origin, else Referer, names http://HOST where HOST is the Host this request was sent to."""
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        if not referer:
            return False
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    return origin == f"http://{request.headers.get('host', '')}"
