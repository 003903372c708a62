"""The local dashboard, served by the daemon as an Extra (see :func:`serve_dashboard`).

Loopback only by default; the token for actions lives in ``<home>/.dashboard.token`` (0600)
and ``contemplation status`` prints the URL with it. Where it listens is recorded in
``<home>/.dashboard.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from contemplation.base.secret_names import DASHBOARD_TOKEN
from contemplation.faces import bearer
from contemplation.store.layout import Home, read_json
from contemplation.writer import atomic_write_json

if TYPE_CHECKING:
    from contemplation.engine.runtime import Runtime

log = structlog.get_logger("contemplation.dashboard")

TOKEN_FILE = DASHBOARD_TOKEN
INFO_FILE = ".dashboard.json"


def token_path(home: Home) -> Path:
    return home.root / TOKEN_FILE


def read_token(home: Home) -> str | None:
    return bearer.read_token(token_path(home))


def ensure_token(home: Home) -> str:
    """The dashboard token; a new one if the file is missing, short or readable by others."""
    return bearer.ensure_token(token_path(home))


def dashboard_info(home: Home) -> dict[str, Any] | None:
    """Where the dashboard of this home listens (as its daemon last recorded it)."""
    return read_json(home.root / INFO_FILE)


def dashboard_link(home: Home) -> str | None:
    """The URL of the running daemon's dashboard with the token in its fragment, or None."""
    info, token = dashboard_info(home), read_token(home)
    daemon = read_json(home.daemon_info) or {}
    if not info or not token or info.get("pid") != daemon.get("pid"):
        return None
    return f"{info.get('url')}#token={token}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


FIRST_REQUEST_TIMEOUT = 10.0  # seconds a new connection may stay silent


def _bounded_protocol(max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with two bounds it lacks: a connection past ``max_connections``
    is closed as soon as it is accepted (uvicorn's own limit only answers requests, so idle
    sockets would pile up to the open-file limit), and one that sends no request within
    FIRST_REQUEST_TIMEOUT is closed (uvicorn's keep-alive timer starts after a response)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Bounded(H11Protocol):
        _silent: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._silent = self.loop.call_later(FIRST_REQUEST_TIMEOUT, self._drop_if_silent)

        def _drop_if_silent(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._silent is not None:
                self._silent.cancel()
            super().connection_lost(exc)

    return Bounded


def _fd_budget() -> int:
    """Connections the dashboard may hold: a quarter of the open-file limit (accept() takes up
    to a listen backlog of sockets at once before any is refused), the rest for the work."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, soft // 4 - 32)


async def serve_dashboard(rt: Runtime, stop: asyncio.Event) -> None:
    """Extra for :func:`contemplation.daemon.root.serve`: the dashboard for the daemon's
    lifetime."""
    import uvicorn  # lazily: only the daemon pays for the web stack

    from contemplation.faces.dashboard.app import Dashboard
    from contemplation.faces.dashboard.live import Broker

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the daemon owns the signals
            yield

    settings = rt.settings
    home = rt.home
    broker = Broker()
    dash = Dashboard(settings, token=ensure_token(home), broker=broker, stop=stop)
    try:
        sock = _bind(settings.dashboard_host, settings.dashboard_port)
    except OSError as exc:
        log.error(  # noqa: TRY400 - one line for an expected condition, no traceback
            "dashboard_unavailable",
            error=str(exc),
            hint="another process uses the port; set dashboard_port or run --dashboard-port N",
        )
        return
    dash.port = int(sock.getsockname()[1])
    rt.observers.append(broker.observe)
    atomic_write_json(
        home.root / INFO_FILE,
        {"url": dash.url, "port": dash.port, "pid": os.getpid()},
        durable=False,
    )
    config = uvicorn.Config(
        dash.asgi(),
        log_config=None,
        access_log=False,
        lifespan="off",
        # more connections get a quick 503; always well inside the open-file limit, so idle
        # clients can never starve the conversations of file descriptors
        http=_bounded_protocol(min(settings.dashboard_max_connections, _fd_budget())),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=2,
        log_level="warning",
    )
    server = Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    log.info("dashboard", url=dash.url)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        server.should_exit = True  # open event streams end on `stop` too
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        with contextlib.suppress(ValueError):
            rt.observers.remove(broker.observe)
        sock.close()
