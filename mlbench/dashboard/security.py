"""Who may use the dashboard: whoever holds its token, from this machine's browser.

The dashboard can start processes, so a page on another web site, another user of this machine
or a name that resolves to 127.0.0.1 (DNS rebinding) must not be able to use it:

- **Token.** A random token is made at start and printed once in the URL (``?token=...``); the
  first request with it gets an HttpOnly, SameSite=Strict cookie and is redirected to the same
  page without the token. Every other request needs that cookie or an ``Authorization: Bearer``
  header (scripts); without it: 401. Tokens are compared in constant time.
- **Host.** Bound to loopback, only ``127.0.0.1``, ``localhost`` and ``[::1]`` with the
  dashboard's port are accepted as the Host header (403 otherwise), which defeats DNS rebinding.
- **Cross-site requests.** A request that changes anything (POST, DELETE, ...) must come from
  the dashboard's own pages: its Origin header, when sent, must be the dashboard's origin, and it
  must carry the ``X-Mlbench-Dashboard`` header (or the bearer token), which a cross-site form
  cannot send and a cross-site script cannot add without a CORS preflight that is never granted.
  A SameSite=Strict cookie is, besides, not sent with a cross-site request at all. (OWASP CSRF
  Prevention Cheat Sheet: "Custom Request Headers", "Verifying Origin With Standard Headers".)
"""

from __future__ import annotations

import hmac
import json
from http.cookies import SimpleCookie
from typing import Any
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlencode

CSRF_HEADER = "x-mlbench-dashboard"
SAFE_METHODS = ("GET", "HEAD")

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]

_UNAUTHORIZED_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>mlbench dashboard</title>
<style>body{font:16px system-ui,sans-serif;max-width:40em;margin:4em auto;color:#222}</style></head>
<body><h1>This dashboard needs its access token</h1><p>Open the address that
<code>mlbench dashboard</code> printed (it ends in <code>?token=...</code>).</p></body></html>"""


def loopback_hosts(port: int) -> set[str]:
    return {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}


class TokenGuard:
    """ASGI middleware that admits only requests with the token (see the module's docstring)."""

    def __init__(self, app: ASGIApp, token: str, cookie_name: str, allowed_hosts: set[str] | None):
        self.app = app
        self.token = token
        self.cookie_name = cookie_name
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.allowed_hosts is not None and host.lower() not in self.allowed_hosts:
            await _refuse(scope, send, 403, f"the dashboard does not answer to the host name {host!r}")
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query and scope["method"] in SAFE_METHODS:
            if not self._valid(query["token"]):
                await _refuse(scope, send, 401, "wrong token: open the address mlbench dashboard printed")
                return
            await self._set_cookie_and_redirect(scope, send, query)
            return
        bearer = headers.get("authorization", "")
        by_bearer = bearer.lower().startswith("bearer ") and self._valid(bearer[7:].strip())
        if not by_bearer and not self._valid(_cookie(headers.get("cookie", ""), self.cookie_name)):
            await _refuse(scope, send, 401, "this dashboard needs its token: open the address "
                                            "mlbench dashboard printed")
            return
        if scope["method"] not in SAFE_METHODS:
            origin = headers.get("origin")
            scheme = scope.get("scheme", "http")
            if origin is not None and origin != f"{scheme}://{host}":
                await _refuse(scope, send, 403, f"cross-site request from {origin} refused")
                return
            if not by_bearer and headers.get(CSRF_HEADER) != "1":
                await _refuse(scope, send, 403, "request refused: it did not come from the "
                                                "dashboard's own pages")
                return
        await self.app(scope, receive, _with_headers(send))

    def _valid(self, candidate: str | None) -> bool:
        if not candidate:
            return False
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    async def _set_cookie_and_redirect(self, scope: Scope, send: Callable, query: dict[str, str]) -> None:
        rest = {k: v for k, v in query.items() if k != "token"}
        location = scope.get("path", "/") + (f"?{urlencode(rest)}" if rest else "")
        cookie = f"{self.cookie_name}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()),
                                (b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer"),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


#: Pages load scripts, styles and data from the dashboard only, and no other site may frame them.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                 b"img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                 b"form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def _with_headers(send: Callable) -> Callable:
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
        await send(message)
    return sending


def _cookie(header: str, name: str) -> str | None:
    try:
        jar = SimpleCookie()
        jar.load(header)
    except Exception:  # a malformed Cookie header is no token
        return None
    morsel = jar.get(name)
    return morsel.value if morsel else None


async def _refuse(scope: Scope, send: Callable, status: int, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    api = scope.get("path", "").startswith("/api/")
    if api or status == 403:
        body, kind = json.dumps({"error": message}).encode(), b"application/json"
    else:
        body, kind = _UNAUTHORIZED_PAGE.encode(), b"text/html; charset=utf-8"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
