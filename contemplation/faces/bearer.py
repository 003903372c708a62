"""The bearer token a local HTTP face demands (the dashboard's, the MCP face's): kept in a
file under the home that only its owner can read (0600), sent as
``Authorization: Bearer <token>`` and compared in constant time. Loopback is no boundary on a
shared machine: every local user can reach 127.0.0.1.

:class:`RequireBearer` is the ASGI middleware for a face whose every request needs it."""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from contemplation.writer import atomic_write_bytes

MIN_LENGTH = 32  # characters; a shorter token in the file is replaced


def read_token(path: Path) -> str | None:
    """The token in ``path``; None when there is none (or it cannot be read)."""
    try:
        token = path.read_text().strip()
    except (FileNotFoundError, PermissionError, UnicodeDecodeError):
        return None
    return token or None


def ensure_token(path: Path) -> str:
    """The token in ``path``; a new one (written 0600) if the file is missing, short or
    readable by others."""
    token = read_token(path)
    with contextlib.suppress(FileNotFoundError):
        if token and len(token) >= MIN_LENGTH and not stat.S_IMODE(path.stat().st_mode) & 0o077:
            return token
    token = secrets.token_urlsafe(32)
    atomic_write_bytes(path, token.encode() + b"\n", mode=0o600)
    return token


def given(headers: Headers) -> str:
    """The token of an ``Authorization: Bearer`` header; "" when there is none."""
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def matches(offered: str, token: str) -> bool:
    """Whether ``offered`` is ``token`` (constant time; an empty one never is)."""
    return bool(offered) and bool(token) and hmac.compare_digest(offered.encode(), token.encode())


class RequireBearer:
    """Every HTTP request needs the token, or it is answered 401 (with
    ``WWW-Authenticate: Bearer``) before the app sees it; ``hint`` says where to find it."""

    def __init__(self, app: ASGIApp, *, token: Callable[[], str], hint: str) -> None:
        self.app = app
        self.token = token
        self.hint = hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in {"http", "websocket"}:  # lifespan
            await self.app(scope, receive, send)
            return
        offered = given(Headers(scope=scope))
        if matches(offered, self.token()):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        said = "wrong token" if offered else "missing token"
        challenge = 'Bearer error="invalid_token"' if offered else "Bearer"
        body = json.dumps({"error": f"{said}: {self.hint}"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", challenge.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
