"""MCP servers as tools: ``server:tool`` in a rule calls ``tool`` on ``[mcp_servers.server]``.

Each configured server is started on first use and kept alive. One long-lived task per
server owns the transport and :class:`ClientSession` context managers (anyio cancel scopes
must be entered and left in the same task); callers only send requests through the session.
A server that dies (the call fails with "connection closed") is restarted and the call is
tried once more; repeated deaths back off (0, 1, 2, 4 … 30 s). Every call runs under the
server's ``timeout``; :meth:`McpPool.aclose` stops every server cleanly.

MCP roots are not advertised unless ``roots`` is configured for the server, and then only
folders inside ``tools.allowed_roots``: the reference filesystem server *replaces* its allowed
folders with the roots a client advertises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog

from contemplation.errors import ConfigError, ToolError
from contemplation.needs.tools.base import ToolResult
from contemplation.settings import McpServerSettings

# The MCP SDK is imported where a server is started or called, not here: importing it takes
# about half a second, which every daemon start (and every `run --once`) would pay even with
# no MCP server configured.
if TYPE_CHECKING:
    import mcp_types as types  # see the module's imports
    from mcp.client.session import ClientRequestContext, ClientSession

log = structlog.get_logger("contemplation.tools.mcp")

STOP_GRACE = 8.0  # seconds a server task gets to shut its transport down
BACKOFF_CAP = 30.0
_STDERR_TAIL = 600


class ServerDied(ToolError):
    """The server's connection closed under a call (the process died or hung up)."""


def render_result(result: types.CallToolResult) -> str:
    """The text of a tool result; non-text parts are described, never dumped."""
    import mcp_types as types  # see the module's imports

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(res.text)
            else:
                parts.append(f"[binary resource {res.uri} ({res.mime_type or 'unknown type'})]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource {block.name}: {block.uri}]")
        else:
            kind = getattr(block, "type", "content")
            mime = getattr(block, "mime_type", "")
            parts.append(f"[{kind} {mime}, not shown]")
    if not any(p.strip() for p in parts) and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False, indent=1)]
    return "\n".join(parts)


def _roots_callback(roots: Sequence[Path]) -> Any:
    import mcp_types as types  # see the module's imports
    from pydantic import FileUrl

    listed = types.ListRootsResult(
        roots=[types.Root(uri=FileUrl(r.as_uri()), name=r.name) for r in roots]
    )

    async def list_roots(context: ClientRequestContext) -> types.ListRootsResult:
        return listed

    return list_roots


def check_roots(name: str, spec: McpServerSettings, allowed: Sequence[Path]) -> tuple[Path, ...]:
    """The roots to advertise; :class:`ConfigError` for one outside ``tools.allowed_roots``."""
    if not spec.roots:
        return ()
    real_allowed = [Path(a).expanduser().resolve() for a in allowed]
    out: list[Path] = []
    for r in spec.roots:
        real = Path(r).expanduser().resolve()
        if not any(real.is_relative_to(a) for a in real_allowed):
            raise ConfigError(
                f"mcp_servers.{name}.roots: {r} is not inside tools.allowed_roots; advertising it "
                "would widen what the server may touch"
            )
        out.append(real)
    return tuple(out)


class McpServer:
    """One configured server: started on first use, kept alive, restarted when it dies."""

    def __init__(
        self,
        name: str,
        spec: McpServerSettings,
        *,
        roots: Sequence[Path] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if bool(spec.command) == bool(spec.url):
            raise ConfigError(f"mcp_servers.{name}: set exactly one of 'command' or 'url'")
        self.name = name
        self.spec = spec
        self.roots = tuple(roots)
        self.clock = clock
        self.starts = 0  # how many times the server was started (restarts = starts - 1)
        self.failures = 0  # consecutive deaths or failed starts
        self._not_before = 0.0
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._errlog: IO[str] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._session is not None and self._task is not None and not self._task.done()

    async def _owner(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        """The task that owns the transport and session for the server's whole life."""
        import httpx2
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        try:
            async with AsyncExitStack() as stack:
                if self.spec.url:
                    http = httpx2.AsyncClient(
                        headers=self.spec.headers or None,
                        timeout=httpx2.Timeout(self.spec.start_timeout, read=300.0),
                    )
                    await stack.enter_async_context(http)
                    read, write = await stack.enter_async_context(
                        streamable_http_client(self.spec.url, http_client=http)
                    )
                else:
                    errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
                    stack.callback(errlog.close)
                    self._errlog = errlog
                    params = StdioServerParameters(
                        command=self.spec.command,
                        args=list(self.spec.args),
                        env=dict(self.spec.env) or None,
                        cwd=self.spec.cwd,
                    )
                    read, write = await stack.enter_async_context(
                        stdio_client(params, errlog=errlog)
                    )
                session = ClientSession(
                    read,
                    write,
                    read_timeout_seconds=self.spec.start_timeout,  # initialize, listings
                    list_roots_callback=_roots_callback(self.roots) if self.roots else None,
                )
                await stack.enter_async_context(session)
                await session.initialize()
                ready.set_result(session)
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("mcp_server_ended", server=self.name, error=repr(exc))
        finally:
            if not ready.done():
                ready.set_exception(ToolError(f"MCP server {self.name!r} stopped while starting"))

    def stderr_tail(self) -> str:
        f = self._errlog
        if f is None or f.closed:
            return ""
        try:
            f.flush()
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _STDERR_TAIL))
            tail = f.read()
        except (OSError, ValueError):
            return ""
        return " ".join(tail.split())[-300:]

    async def _start(self) -> ClientSession:
        now = self.clock()
        if now < self._not_before:
            raise ToolError(
                f"MCP server {self.name!r} keeps failing; "
                f"next try in {self._not_before - now:.0f} s"
            )
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[ClientSession] = loop.create_future()
        stop = asyncio.Event()
        self._stop = stop
        self._task = loop.create_task(self._owner(ready, stop), name=f"mcp:{self.name}")
        self.starts += 1
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                session = await asyncio.shield(ready)
        except BaseException as exc:
            await self._shutdown()
            if isinstance(exc, Exception):
                self._failed()
            if isinstance(exc, TimeoutError):
                raise ToolError(
                    f"MCP server {self.name!r} did not start within {self.spec.start_timeout:g} s"
                ) from None
            if isinstance(exc, Exception):
                detail = self.stderr_tail()
                raise ToolError(
                    f"could not start MCP server {self.name!r}: {_describe(exc)}"
                    + (f" (stderr: {detail})" if detail else "")
                ) from None
            raise
        self._session = session
        log.info("mcp_server_started", server=self.name, starts=self.starts)
        return session

    def _failed(self) -> None:
        self.failures += 1
        delay = 0.0 if self.failures <= 1 else min(BACKOFF_CAP, 2.0 ** (self.failures - 2))
        self._not_before = self.clock() + delay

    async def session(self) -> ClientSession:
        if self._closed:
            raise ToolError(f"MCP server {self.name!r} is shut down")
        async with self._lock:
            if self.running:
                assert self._session is not None
                return self._session
            if self._task is not None:
                await self._shutdown()  # the old task ended on its own: clean it up first
            return await self._start()

    async def _shutdown(self) -> None:
        task, stop = self._task, self._stop
        self._session = None
        self._task = None
        if task is None:
            return
        if stop is not None:
            stop.set()
        try:
            async with asyncio.timeout(STOP_GRACE):
                await asyncio.shield(task)
        except (TimeoutError, Exception):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _dead(self, session: ClientSession) -> None:
        """Forget a session whose connection closed (only if it is still the current one)."""
        async with self._lock:
            if self._session is session:
                self._failed()
                await self._shutdown()

    async def aclose(self) -> None:
        self._closed = True
        async with self._lock:
            await self._shutdown()

    # -- calls ------------------------------------------------------------------------

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Call ``tool``; a death under the call restarts the server and tries once more."""
        for attempt in (1, 2):
            session = await self.session()
            try:
                return await self._call_once(session, tool, arguments)
            except ServerDied as exc:
                await self._dead(session)
                log.warning("mcp_server_died", server=self.name, tool=tool, attempt=attempt)
                if attempt == 2:
                    raise ToolError(
                        f"MCP server {self.name!r} died twice during {tool}; {exc}"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call_once(
        self, session: ClientSession, tool: str, arguments: Mapping[str, Any]
    ) -> ToolResult:
        from mcp.shared.exceptions import MCPError
        from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

        source = f"{self.name}:{tool}"
        try:
            async with asyncio.timeout(self.spec.timeout):
                result = await session.call_tool(
                    tool, dict(arguments), read_timeout_seconds=self.spec.timeout
                )
        except TimeoutError:
            raise ToolError(f"{source} did not answer within {self.spec.timeout:g} s") from None
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:  # the SDK's own clock ran out first
                raise ToolError(f"{source} did not answer within {self.spec.timeout:g} s") from None
            if exc.code == CONNECTION_CLOSED:
                detail = self.stderr_tail()
                raise ServerDied(
                    "the connection closed" + (f" (stderr: {detail})" if detail else "")
                ) from None
            raise ToolError(f"{source} failed: {exc.message}") from None
        except (OSError, EOFError, ConnectionError) as exc:
            raise ServerDied(_describe(exc)) from None
        except Exception as exc:
            if type(exc).__name__ in {"ClosedResourceError", "BrokenResourceError", "EndOfStream"}:
                raise ServerDied(_describe(exc)) from None
            raise ToolError(f"{source} failed: {_describe(exc)}") from None
        self.failures = 0
        text = render_result(result)
        if result.is_error:
            raise ToolError(f"{source} reported an error: {text.strip()[:500] or '(no detail)'}")
        return ToolResult(text, source)

    async def list_tools(self) -> list[types.Tool]:
        session = await self.session()
        async with asyncio.timeout(self.spec.timeout):
            listing = await session.list_tools()
        return list(listing.tools)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class McpPool:
    """Every configured server by name."""

    def __init__(
        self,
        specs: Mapping[str, McpServerSettings],
        *,
        allowed_roots: Sequence[Path] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servers = {
            name: McpServer(name, spec, roots=check_roots(name, spec, allowed_roots), clock=clock)
            for name, spec in specs.items()
        }

    def server(self, name: str) -> McpServer:
        try:
            return self.servers[name]
        except KeyError:
            raise ToolError(f"no MCP server named {name!r} is configured") from None

    async def call(self, server: str, tool: str, arguments: Mapping[str, Any]) -> ToolResult:
        return await self.server(server).call(tool, arguments)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.servers.values()))


class McpTool:
    """The :class:`~contemplation.needs.tools.base.Tool` face of one ``server:tool``."""

    def __init__(self, pool: McpPool, server: str, tool: str) -> None:
        self.pool = pool
        self.server = server
        self.tool = tool
        self.name = f"{server}:{tool}"

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        return await self.pool.call(self.server, self.tool, arguments)
