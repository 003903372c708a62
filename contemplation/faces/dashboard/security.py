"""The dashboard's front door, as one ASGI middleware.

* every request: the ``Host`` header must name this server (127.0.0.1 / localhost / [::1]
  with our port): a DNS-rebinding page gets 400, whatever its address resolves to;
* every read of conversation data (``/api/…``): the token too, as ``Authorization: Bearer``
  or ``?token=`` (an event stream or a download link cannot send headers), on loopback as
  well: any local user of a shared machine can reach 127.0.0.1;
* every state-changing request (anything but GET/HEAD): ``Authorization: Bearer <token>``
  (the token from the 0600 file), ``Content-Type: application/json`` and, when the browser
  sends one, an ``Origin`` of this server; and a body of at most ``max_body`` bytes (413
  beyond, by ``Content-Length`` before anything is read, else as the chunks arrive);
* every response: a strict CSP, no framing, no sniffing, no referrer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contemplation.faces import bearer

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
SAFE_METHODS = {"GET", "HEAD"}


def allowed_hosts(bind_host: str, port: int) -> set[str]:
    names = set(LOOPBACK)
    if bind_host not in {"127.0.0.1", "::1", "localhost", "0.0.0.0", "::"}:  # noqa: S104
        names.add(f"[{bind_host}]" if ":" in bind_host else bind_host)
    return {f"{n}:{port}" for n in names}


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        token: Callable[[], str],
        hosts: Callable[[], set[str]],
        reads_need_token: bool = True,
        max_body: int = 1 << 20,
    ) -> None:
        self.app = app
        self.token = token
        self.hosts = hosts
        self.reads_need_token = reads_need_token
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope["method"], headers)
        if refusal is None and self.reads_need_token and _holds_data(scope["path"]):
            given = bearer.given(headers) or _query_token(scope.get("query_string", b""))
            if not bearer.matches(given, self.token()):
                refusal = 401, "reads need the token (see `contemplation status`)"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = [(k, v) for k, v in message.get("headers", []) if k not in _OURS]
                message = {**message, "headers": raw + SECURITY_HEADERS}
            await send(message)

        if refusal is None and scope["method"] not in SAFE_METHODS:
            refusal, receive = await self._bounded_body(headers, receive)
        if refusal is not None:
            status, text = refusal
            body = json.dumps({"error": text}).encode()
            await send_with_headers(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send_with_headers)

    async def _bounded_body(
        self, headers: Headers, receive: Receive
    ) -> tuple[tuple[int, str] | None, Receive]:
        """The request body read whole, at most ``max_body`` bytes, and a ``receive`` that
        replays it to the app; or the 413 refusal (a 400 for a body that ends early)."""
        too_big = 413, f"the request body is larger than {self.max_body} bytes"
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            return too_big, receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return (400, "the client went away before the body was sent"), receive
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return too_big, receive
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return None, replay

    def _refusal(self, method: str, headers: Headers) -> tuple[int, str] | None:
        hosts = self.hosts()
        if headers.get("host", "").lower() not in hosts:
            return 400, "invalid Host header"
        if method in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in {f"http://{h}" for h in hosts}:
            return 403, "cross-origin request refused"
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return 415, "state-changing requests take Content-Type: application/json"
        if not bearer.matches(bearer.given(headers), self.token()):
            return 401, "missing or wrong token (see `contemplation status`)"
        return None


_OURS = {k for k, _ in SECURITY_HEADERS}


def _query_token(query: bytes) -> str:
    """``?token=`` for the event stream (a browser's EventSource cannot send headers)."""
    values = parse_qs(query.decode("latin-1")).get("token") or [""]
    return values[0]


def _holds_data(path: str) -> bool:
    """Everything but the page shell, its static files and /health shows conversation data."""
    return path.startswith("/api/")
