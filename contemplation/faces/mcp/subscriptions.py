"""Resource subscriptions of both protocol eras over one poller: ``resources/subscribe``
sessions get ``notifications/resources/updated`` on the session, and ``subscriptions/listen``
streams (2026-07-28) get it through the SDK's own listen handler. The daemon is another
process, so what is subscribed is polled (a few ``stat`` calls per resource every
:data:`WATCH_EVERY` seconds; a status is recomputed only when one of its files changed). Every
count is bounded: resources watched, subscriptions per session and per stream, listen
streams, and each stream's backlog. A session's subscriptions go when it ends."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.mcpserver import MCPServer
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    UnsubscribeRequestParams,
)

from contemplation.errors import ContemplationError
from contemplation.faces.mcp.calls import Faces
from contemplation.store.layout import (
    Conv,
)
from contemplation.writer import daemon_alive

WATCH_EVERY = 0.25  # seconds between two looks at the subscribed resources
RECOMPUTE_EVERY = 5.0  # a watched status is recomputed at least this often
LISTEN_BACKLOG = 256  # events a listen stream may hold unread before the SDK ends it
SEND_TIMEOUT = 5.0  # a notification a session cannot take in this long is dropped

TaskListen = Callable[
    [ServerRequestContext[Any, Any], SubscriptionsListenRequestParams, list[str]],
    Awaitable[SubscriptionsListenResult],
]
URI_RE = re.compile(r"conversation://(?P<id>[^/]+)/(?P<kind>log|status)")


def task_ids_of(params: SubscriptionsListenRequestParams) -> list[str] | None:
    """The ``taskIds`` a listen request names (None: it names none)."""
    got = (params.notifications.model_extra or {}).get("taskIds")
    if got is None:
        return None
    if not isinstance(got, list) or not all(isinstance(i, str) for i in got):
        raise MCPError(INVALID_PARAMS, "taskIds is a list of task ids")
    return list(dict.fromkeys(got))


def stat_key(path: os.PathLike[str]) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
    """The session's connection: its ``exit_stack`` is how we learn that the session ended.
    mcp 2.3.0 hands lowlevel handlers no public way to it (only the unused ``Context`` has
    ``.connection``), so it is read off the session, and None if a later SDK moves it."""
    conn = getattr(ctx.session, "_connection", None)
    return conn if isinstance(conn, Connection) else None


@dataclass(eq=False)
class _Watch:
    """One subscribed resource: how it looked last time, and how many subscriptions hold it."""

    uri: str
    conv: Conv
    kind: str  # "log" or "status"
    gate: tuple[Any, ...] = ()  # the stats that must change before the value is looked at
    value: Any = None  # what a change is decided on (None: the conversation is gone)
    holders: int = 0


@dataclass(eq=False)
class _Peer:
    """A session that subscribed with resources/subscribe (the 2025 protocol)."""

    session: ServerSession
    conn: Connection | None
    uris: set[str] = field(default_factory=set)


class Subscriptions:
    """Resource subscriptions of both protocol eras over one poller (see the module doc)."""

    def __init__(self, faces: Faces) -> None:
        self.faces = faces
        self.bus = InMemorySubscriptionBus()
        self.listener = ListenHandler(
            self.bus,
            max_subscriptions=faces.limits.max_listen_streams,
            max_buffered_events=LISTEN_BACKLOG,
        )
        self.watches: dict[str, _Watch] = {}
        self.peers: dict[int, _Peer] = {}
        self._owner: object | None = None
        #: serves a listen stream that names task ids (set by the tasks' push)
        self.push: TaskListen | None = None

    # -- what is watched ----------------------------------------------------------------

    def _resolve(self, uri: str) -> tuple[Conv, str]:
        m = URI_RE.fullmatch(uri)
        if m is None:
            raise MCPError(
                INVALID_PARAMS,
                f"unknown resource {uri!r}: subscribe to conversation://<id>/log or /status",
            )
        try:
            return self.faces.reader.locate(m["id"]), m["kind"]
        except ContemplationError as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from exc

    async def hold(self, uri: str) -> None:
        """Watch ``uri`` for one more subscription."""
        if uri not in self.watches:
            conv, kind = self._resolve(uri)
            watch = _Watch(uri, conv, kind)
            watch.conv, watch.gate, watch.value = await anyio.to_thread.run_sync(self._look, watch)
            watched = self.faces.limits.max_watched
            if uri not in self.watches and len(self.watches) >= watched:  # after the await
                raise MCPError(
                    INVALID_REQUEST,
                    f"this server watches at most {watched} resources at once; "
                    "unsubscribe from some first",
                )
            self.watches.setdefault(uri, watch)
        self.watches[uri].holders += 1

    def release(self, uri: str) -> None:
        watch = self.watches.get(uri)
        if watch is None:
            return
        watch.holders -= 1
        if watch.holders <= 0:
            del self.watches[uri]

    # -- looking (in a worker thread) ----------------------------------------------------

    def _look(self, w: _Watch) -> tuple[Conv, tuple[Any, ...], Any]:
        """Where the conversation is now, its gate, and its value (recomputed only when the
        gate moved). Never raises: a failed look reports no change."""
        try:
            conv = w.conv
            if not conv.dir.is_dir():  # archived (or removed) since the last look
                conv = self.faces.reader.locate(conv.id)
            if w.kind == "log":
                gate: tuple[Any, ...] = (str(conv.dir), stat_key(conv.log))
                return conv, gate, gate
            files = (conv.state, conv.metadata, conv.inbox, conv.processing, conv.log)
            # two changes within one mtime tick can leave the stats as they were: the time
            # slot makes sure the status is recomputed at least every RECOMPUTE_EVERY seconds
            slot = int(time.monotonic() // RECOMPUTE_EVERY)
            gate = (str(conv.dir), daemon_alive(self.faces.home), slot, *map(stat_key, files))
            if gate == w.gate:
                return conv, gate, w.value
            return conv, gate, self.faces.status_text(conv)
        except ContemplationError:
            return w.conv, (), None  # gone: one last notification, then quiet
        except OSError:
            return w.conv, w.gate, w.value

    def _scan(self, watches: list[_Watch]) -> list[tuple[_Watch, Conv, tuple[Any, ...], Any]]:
        return [(w, *self._look(w)) for w in watches]

    async def run(self) -> None:
        """Look at the watched resources every WATCH_EVERY seconds until cancelled. A server
        entered twice at once (in-process clients) polls once: the first run owns the loop
        and another takes over when it ends."""
        token = object()
        try:
            while True:
                if self._owner is None:
                    self._owner = token
                if self._owner is token and self.watches:
                    await self._tick()
                await anyio.sleep(WATCH_EVERY)
        finally:
            if self._owner is token:
                self._owner = None

    async def _tick(self) -> None:
        seen = await anyio.to_thread.run_sync(self._scan, list(self.watches.values()))
        for w, conv, gate, value in seen:
            changed = value != w.value
            w.conv, w.gate, w.value = conv, gate, value
            if changed and self.watches.get(w.uri) is w:
                await self._notify(w.uri)

    async def _notify(self, uri: str) -> None:
        await self.bus.publish(ResourceUpdated(uri=uri))
        for peer in [p for p in self.peers.values() if uri in p.uris]:
            with anyio.move_on_after(SEND_TIMEOUT):
                if peer.conn is not None:
                    await peer.conn.send_resource_updated(uri)  # never raises
                else:
                    await peer.session.send_resource_updated(uri)

    # -- the protocol handlers -----------------------------------------------------------

    def _peer(self, ctx: ServerRequestContext[Any, Any]) -> _Peer:
        conn = connection_of(ctx)
        key = id(conn)
        peer = self.peers.get(key)
        if peer is None:
            peer = self.peers[key] = _Peer(ctx.session, conn)
            if conn is not None:
                conn.exit_stack.callback(self._forget, key)
        return peer

    def _forget(self, key: int) -> None:
        """A session ended: its subscriptions go with it."""
        peer = self.peers.pop(key, None)
        for uri in peer.uris if peer else ():
            self.release(uri)

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        peer = self._peer(ctx)
        uri = str(params.uri)
        if uri not in peer.uris:
            self._resolve(uri)  # a bad resource is said to be bad before any limit
            if len(peer.uris) >= (most := self.faces.limits.max_subscriptions):
                raise MCPError(
                    INVALID_REQUEST,
                    f"at most {most} subscriptions per session; unsubscribe from one first",
                )
            await self.hold(uri)
            peer.uris.add(uri)
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        peer = self.peers.get(id(connection_of(ctx)))
        uri = str(params.uri)
        if peer is not None and uri in peer.uris:
            peer.uris.discard(uri)
            self.release(uri)
        return EmptyResult()

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        """The SDK's listen handler, with the stream's resources watched while it is open."""
        task_ids = task_ids_of(params) if self.push is not None else None
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        if len(uris) > (most := self.faces.limits.max_subscriptions):
            raise MCPError(INVALID_PARAMS, f"at most {most} resources per listen stream")
        held: list[str] = []
        try:
            for uri in uris:
                await self.hold(uri)
                held.append(uri)
            if task_ids is not None and self.push is not None:  # tasks: the push serves it
                return await self.push(ctx, params, task_ids)
            return await self.listener(ctx, params)
        finally:
            for uri in held:
                self.release(uri)

    def install(self, server: MCPServer[Any]) -> None:
        """Serve subscribe, unsubscribe and listen through this object. MCPServer has no
        public way to a spec method's handler; the SDK's own Client reaches the lowlevel
        server the same way."""
        low: LowLevelServer[Any] = server._lowlevel_server
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self.subscribe)
        low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self.unsubscribe)
        low.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, self.listen
        )
