"""The MCP face for agents: six tools, and each conversation's log and status as resources a
client can subscribe to.

It reads the folder (:mod:`contemplation.reading`) and writes only through
:mod:`contemplation.writer` (via :mod:`contemplation.actions`), so it works whether or not a
daemon runs; no tool waits for inference longer than ``conversation_wait``'s cap.

A tool's result is one compact JSON text block and nothing else: no indentation, and no
``structuredContent`` copy of the same object (Claude Code and VS Code show the structured copy
*instead of* the text when both are there, other clients only the text; one block means every
client sees the same thing once).

Subscriptions: the daemon is another process, so the server polls what is subscribed (a few
``stat`` calls per resource every :data:`WATCH_EVERY` seconds; a status is recomputed only when
one of its files changed) and tells both protocol eras: ``resources/subscribe`` sessions get
``notifications/resources/updated`` on the session, and ``subscriptions/listen`` streams
(2026-07-28) get it through the SDK's own listen handler. Every count is bounded: resources
watched, subscriptions per session and per stream, listen streams, and each stream's backlog.
A session's subscriptions go when it ends.

stdout carries the protocol only (the SDK points fd 1 at stderr while serving; logs go to
stderr).
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import wraps
from typing import Annotated, Any, Concatenate, ParamSpec, TypeVar

import anyio
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
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
    ToolAnnotations,
    UnsubscribeRequestParams,
)
from mcp_types import Resource as MCPResource
from pydantic import Field

from contemplation import __version__, actions, activity, paging
from contemplation.errors import ContemplationError, InputRejected
from contemplation.layout import (
    Conv,
    Home,
    inbox_entries,
    processing_entries,
    read_metadata,
    read_state,
)
from contemplation.models import BUSY, Decision, Status
from contemplation.reading import Reader, Since, block_dict, log_text, own, segments
from contemplation.settings import Settings
from contemplation.waiting import WaitItem
from contemplation.writer import daemon_alive

MODELS_SHOWN = 50  # model names per backend in conversation_models
MODELS_WAIT = 10.0  # seconds conversation_models waits for the backends in all
LIST_DEFAULT = 20  # conversations in one page of conversation_list
LIST_CAP = 200
WAIT_DEFAULT = 45.0
WAIT_CAP = 50.0  # well under Claude Desktop's 60 s cut of a tool call
POLL = 0.1
PROGRESS_EVERY = 5.0  # seconds between two progress notifications of conversation_wait

WATCH_EVERY = 0.25  # seconds between two looks at the subscribed resources
RECOMPUTE_EVERY = 5.0  # a watched status is recomputed at least this often
MAX_WATCHED = 256  # resources watched at once, over all sessions
MAX_SUBSCRIPTIONS = 64  # per session (resources/subscribe) and per listen stream
MAX_LISTEN_STREAMS = 32  # open subscriptions/listen streams
LISTEN_BACKLOG = 256  # events a listen stream may hold unread before the SDK ends it
SEND_TIMEOUT = 5.0  # a notification a session cannot take in this long is dropped

LIST_FILTERS = ("active", "all", "archived", *(s.value for s in Status))
URI_RE = re.compile(r"conversation://(?P<id>[^/]+)/(?P<kind>log|status)")

INSTRUCTIONS = """\
Asynchronous conversations with local LLMs. conversation_start queues a first message and
returns a cursor at once; conversation_wait (or conversation_check) with the latest returned
cursor picks up the reply. When the model stops for you, `waiting` lists each item with its id
and the call that settles it: a need (answer with conversation_respond) or a lookup waiting
for approval (decide with conversation_approve: the tool answers it, never your text).
Subscribe to conversation://<id>/status or /log to be told when a conversation changes."""

EMPTY_HINT = "The conversation is empty: send the first message with conversation_respond."

Progress = Callable[[float, float, str], Awaitable[None]]
P = ParamSpec("P")
R = TypeVar("R")
Id = Annotated[str, Field(description="conversation id (or a unique prefix)")]
Cursor = Annotated[
    int | None, Field(ge=0, description="cursor from the previous call; only newer blocks")
]
MaxBytes = Annotated[
    int,
    Field(
        ge=paging.PAGE_FLOOR,
        le=paging.PAGE_CAP,
        description="most bytes of blocks in one result; a cut page continues at its cursor",
    ),
]
IncludeOwn = Annotated[
    bool, Field(description="also return your own messages and answers (left out by default)")
]


def _json(obj: Any) -> str:
    """The one encoding of a tool result: compact, and non-ASCII text kept as it is."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _errors_as_tool_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """One-line errors the agent can act on, instead of a traceback."""

    @wraps(fn)
    def inner(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ContemplationError as exc:
            raise ToolError(str(exc)) from exc
        except OSError as exc:
            raise ToolError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from exc

    return inner


def _locked(fn: Callable[Concatenate[Faces, P], R]) -> Callable[Concatenate[Faces, P], R]:
    def inner(self: Faces, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.lock:
            return fn(self, *args, **kwargs)

    return inner


def _own(block: dict[str, Any]) -> bool:
    """A block the agent wrote (see :func:`contemplation.reading.own`)."""
    return own(str(block.get("kind")), "response_to" in block, str(block.get("text", "")))


def _log_size(conv: Conv) -> int:
    segs = segments(conv)
    return segs[-1].end if segs else 0


class Faces:
    """The tool bodies, kept apart from the SDK so they are plain, testable functions."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = Home(settings.home)
        self.reader = Reader(self.home)
        self.lock = threading.RLock()  # sync tools run in worker threads; the caches are shared

    # -- helpers ------------------------------------------------------------------------

    def _hint(
        self, conv: Conv, status: str, waiting: list[WaitItem], alive: bool, empty: bool
    ) -> str:
        if conv.is_completed:
            return "This conversation is archived: conversation_reopen brings it back to continue."
        down = (
            f"No contemplation daemon is running on {self.home.root}: messages stay queued "
            "until one starts (`contemplation run`, or `contemplation service install`)."
        )
        if waiting:
            asks = sum(1 for i in waiting if i.kind == "approval")
            parts = []
            if asks:
                parts.append(
                    f"decide about {asks} lookup(s) with conversation_approve (their answers "
                    "come from the tool, never from your text)"
                )
            if len(waiting) > asks:
                parts.append(f"answer {len(waiting) - asks} need(s) with conversation_respond")
            said = "The model waits for you: " + "; ".join(parts) + ". Each item says how."
            return said if alive else f"{said} {down}"
        if not alive:
            return down
        if empty:
            return EMPTY_HINT
        if status in {s.value for s in BUSY}:
            return "The model is working: conversation_wait returns when it replies."
        if status == Status.ERROR.value:
            return "The last turn failed: send a message with conversation_respond to try again."
        return ""

    def _since(self, conv: Conv, cursor: int) -> Since:
        """Blocks after ``cursor``; a cursor past the end gets nothing and the real end."""
        total = _log_size(conv)
        if cursor > total:
            return Since([], total, total)
        return self.reader.since(conv, cursor)

    @_locked
    def snapshot(self, conv: Conv, *, written: int | None = None) -> dict[str, Any]:
        """Where a conversation stands (what ``check`` says besides the blocks, and what the
        status resource holds). ``written``: characters of a reply being streamed, if known."""
        meta = read_metadata(conv)
        state = read_state(conv)
        items = self.reader.waiting(conv)
        status = state.status.value if state else Status.PENDING.value
        alive = daemon_alive(self.home)
        queued = (
            0 if conv.is_completed else len(inbox_entries(conv)) + len(processing_entries(conv))
        )
        model = meta.model if meta else ""
        behind = 0
        if queued and meta is not None:
            rows = self.reader.summaries(include_completed=False)
            behind = activity.queued_behind(conv.id, meta.backend, model, rows)
        asks = sum(1 for i in items if i.kind == "approval")
        out: dict[str, Any] = {
            "conversation_id": conv.id,
            "topic": meta.topic if meta else "",
            "status": status,
            "activity": activity.describe(
                state,
                model=model,
                daemon=alive,
                queued=queued,
                behind=behind,
                written=written,
                waiting=(len(items) - asks, asks),
            ),
            "archived": conv.is_completed,
            "model": model,
            "waiting": [i.as_dict(conv.id, "mcp") for i in items],
            "queued_messages": queued,
            "last_error": state.last_error.model_dump() if state and state.last_error else None,
            "daemon_alive": alive,
        }
        empty = queued == 0 and _log_size(conv) == 0
        hint = self._hint(conv, status, items, alive, empty)
        if hint:
            out["hint"] = hint
        return out

    @_locked
    def check(
        self,
        conversation_id: str,
        since: int | None = None,
        *,
        include_own: bool = False,
        max_bytes: int = paging.PAGE_BYTES,
    ) -> dict[str, Any]:
        """The snapshot and the blocks after ``since`` (None: after the agent's own last
        message, so a reply and the rules' answers to its needs are never skipped), at most
        ``max_bytes`` of them: a page cut short says so and its cursor continues at the cut."""
        conv = self.reader.locate(conversation_id)
        start = self.last_exchange(conv) if since is None else since

        def keep(b: dict[str, Any]) -> bool:
            return include_own or not _own(b)

        offered: list[tuple[dict[str, Any], int]] = []
        inside = self.reader.block_at(conv, start) if start > 0 else None
        # a cursor from a page cut inside this block: header + 1 + bytes of text shown (a
        # cursor past all its text is the end of the log as it was, before a separator)
        if inside is not None and start - inside[1] - 1 < len(inside[0].text.encode()):
            block, at = inside
            whole = block_dict(block, at)
            if keep(whole):
                before = start - at - 1
                offered.append((paging.continuation(whole, before), before))
            start = at + (block.end - block.offset)
        got = self._since(conv, start)
        offered.extend((b, 0) for b in got.blocks)
        budget = min(max(int(max_bytes), paging.PAGE_FLOOR), paging.PAGE_CAP)
        page = paging.fit(offered, budget, keep=lambda b: True if b.get("continues") else keep(b))
        partial = got.partial
        written = len(str(partial.get("text", ""))) if partial is not None else None
        out = self.snapshot(conv, written=written)
        out["blocks"] = page.blocks
        out["cursor"] = got.cursor if page.cursor is None else page.cursor
        if page.cut is not None:
            out["cut"] = page.cut | {"next": "more follows: call again with the returned cursor"}
        elif partial is not None and keep(partial):
            room = budget - paging.size(page.blocks)
            text = str(partial.get("text", ""))
            if paging.size(partial) > room:  # a long reply still streaming: its head
                partial = partial | {"text": paging.cut_text(text, max(room, 256)), "cut": True}
            out["in_progress"] = partial
        return out

    @_locked
    def status_text(self, conv: Conv) -> str:
        """The status resource: :meth:`snapshot` as compact JSON."""
        return _json(self.snapshot(conv))

    @_locked
    def settled(self, conv: Conv) -> bool:
        return self.reader.settled(conv)

    async def models(self) -> dict[str, Any]:
        """Backends with their model names (bounded: MODELS_SHOWN each, MODELS_WAIT in all),
        the defaults and the templates: what conversation_start can name."""
        from contemplation import cli_models
        from contemplation.layout import load_template, template_dirs

        s = self.settings
        with anyio.move_on_after(MODELS_WAIT) as scope:
            listing = await cli_models.list_all(s, cli_models.configured(s, ()))
        out: dict[str, Any] = {
            "default_backend": s.default_backend,
            "default_model": s.default_model,
        }
        if scope.cancelled_caught:
            out["backends"] = [{"error": f"the backends did not answer within {MODELS_WAIT:g} s"}]
        else:
            out["backends"] = [_backend_row(e) for e in listing]
        templates = []
        for name in template_dirs(self.home):
            try:
                tpl = load_template(self.home, name)
            except ContemplationError as exc:
                templates.append({"name": name, "error": str(exc)})
                continue
            templates.append({"name": name, "description": tpl.description})
        out["templates"] = templates
        return out

    @_locked
    def last_exchange(self, conv: Conv) -> int:
        """Cursor of the agent's own latest block (what "new" means when no cursor is given):
        the model's replies and the rules' answers after it are all new."""
        return self.reader.last_own(conv)

    @_locked
    def replied_since(self, conv: Conv, since: int) -> bool:
        got = self._since(conv, since)
        return any(b.get("kind") == "model" for b in got.blocks)

    async def wait(
        self,
        conversation_id: str,
        since: int | None = None,
        timeout_s: float = WAIT_DEFAULT,
        *,
        include_own: bool = False,
        progress: Progress | None = None,
        max_bytes: int = paging.PAGE_BYTES,
    ) -> dict[str, Any]:
        """Until the model has replied (after ``since``) or the conversation is settled, or
        the time is up; ``progress`` is told what is happening every PROGRESS_EVERY seconds
        (MCP progress notifications: a client shows them, and its idle clock starts again)."""
        budget = min(max(float(timeout_s), 0.0), WAIT_CAP)
        start = time.monotonic()
        deadline = start + budget
        conv = self.reader.locate(conversation_id)
        if since is not None:  # past the end: nothing is there yet, so new is what comes next
            since = min(since, _log_size(conv))
        timed_out = False
        told = start
        while True:
            if not conv.dir.is_dir():  # archived meanwhile
                conv = self.reader.locate(conv.id)
            if self.settled(conv) or (since is not None and self.replied_since(conv, since)):
                break
            if not daemon_alive(self.home):
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if progress is not None and now - told >= PROGRESS_EVERY:
                told = now
                line = self.check(conv.id, since).get("activity", "")
                await progress(now - start, budget, str(line))
            await anyio.sleep(POLL)
        cursor = since if since is not None else self.last_exchange(conv)
        out = self.check(conv.id, cursor, include_own=include_own, max_bytes=max_bytes)
        out["timed_out"] = timed_out
        if timed_out:
            out["hint"] = (
                f"Still running ({out.get('activity', out['status'])}): call conversation_wait "
                "again with the returned cursor."
            )
        return out

    @_locked
    def list(
        self,
        status: str | None = None,
        *,
        limit: int = LIST_DEFAULT,
        cursor: str | None = None,
        model: str | None = None,
        query: str | None = None,
    ) -> dict[str, Any]:
        """One page of conversations, newest activity first: only what an agent needs to pick
        one, how many match, and an opaque cursor for the next page (keyset on activity and
        id, so rows that change between calls are neither repeated nor skipped)."""
        want = (status or "active").strip().lower()
        want = "archived" if want == "completed" else want
        if want not in LIST_FILTERS:
            raise InputRejected(
                f"unknown status filter {status!r}; use one of: {', '.join(LIST_FILTERS)}"
            )
        rows = self.reader.summaries(include_completed=want in {"all", "archived", "complete"})
        if want == "archived":
            rows = [r for r in rows if r["completed"]]
        elif want not in {"active", "all"}:
            rows = [r for r in rows if r["status"] == want]
        if model:
            rows = [r for r in rows if model in {r["model"], f"{r['backend']}/{r['model']}"}]
        if query:
            words = query.casefold().split()
            rows = [r for r in rows if all(w in str(r["topic"]).casefold() for w in words)]
        rows.sort(key=lambda r: (r["last_activity_ts"], r["id"]), reverse=True)
        total = len(rows)
        if cursor:
            after = _decode_cursor(cursor)
            rows = [r for r in rows if (r["last_activity_ts"], r["id"]) < after]
        size = min(max(int(limit), 1), LIST_CAP)
        page, more = rows[:size], len(rows) > size
        out: dict[str, Any] = {
            "conversations": [self._row(r) for r in page],
            "count": len(page),
            "total": total,
            "more": more,
        }
        if more:
            last = page[-1]
            out["cursor"] = _encode_cursor(last["last_activity_ts"], last["id"])
        return out

    def _row(self, r: dict[str, Any]) -> dict[str, Any]:
        row = {k: r[k] for k in ("id", "topic", "status", "model", "last_activity")}
        if r["completed"]:
            row["archived"] = True
        if r["status"] in {Status.AWAITING_AGENT.value, Status.AWAITING_APPROVAL.value}:
            items = self.reader.waiting(self.reader.locate(r["id"]))
            asks = sum(1 for i in items if i.kind == "approval")
            row["waits_for"] = {"needs": len(items) - asks, "lookups": asks}
        return row


def _backend_row(entry: dict[str, Any]) -> dict[str, Any]:
    if not entry["ok"]:
        return {"backend": entry["backend"], "error": entry["error"]}
    names = [m["name"] for m in entry.get("models", [])]
    more = len(names) - MODELS_SHOWN + int(entry.get("more") or 0)
    row: dict[str, Any] = {"backend": entry["backend"], "models": names[:MODELS_SHOWN]}
    return row | {"more": more} if more > 0 else row


def _encode_cursor(ts: float, conv_id: str) -> str:
    raw = json.dumps([ts, conv_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        ts, conv_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(ts), str(conv_id)
    except (ValueError, TypeError) as exc:
        raise InputRejected(
            "not a cursor this server gave (pass the `cursor` of the previous page as it is)"
        ) from exc


# --------------------------------------------------------------------------- subscriptions


def _stat_key(path: os.PathLike[str]) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _connection(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
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
            self.bus, max_subscriptions=MAX_LISTEN_STREAMS, max_buffered_events=LISTEN_BACKLOG
        )
        self.watches: dict[str, _Watch] = {}
        self.peers: dict[int, _Peer] = {}
        self._owner: object | None = None

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
            if uri not in self.watches and len(self.watches) >= MAX_WATCHED:  # after the await
                raise MCPError(
                    INVALID_REQUEST,
                    f"this server watches at most {MAX_WATCHED} resources at once; "
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
                gate: tuple[Any, ...] = (str(conv.dir), _stat_key(conv.log))
                return conv, gate, gate
            files = (conv.state, conv.metadata, conv.inbox, conv.processing, conv.log)
            # two changes within one mtime tick can leave the stats as they were: the time
            # slot makes sure the status is recomputed at least every RECOMPUTE_EVERY seconds
            slot = int(time.monotonic() // RECOMPUTE_EVERY)
            gate = (str(conv.dir), daemon_alive(self.faces.home), slot, *map(_stat_key, files))
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
        conn = _connection(ctx)
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
            if len(peer.uris) >= MAX_SUBSCRIPTIONS:
                raise MCPError(
                    INVALID_REQUEST,
                    f"at most {MAX_SUBSCRIPTIONS} subscriptions per session; "
                    "unsubscribe from one first",
                )
            await self.hold(uri)
            peer.uris.add(uri)
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        peer = self.peers.get(id(_connection(ctx)))
        uri = str(params.uri)
        if peer is not None and uri in peer.uris:
            peer.uris.discard(uri)
            self.release(uri)
        return EmptyResult()

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        """The SDK's listen handler, with the stream's resources watched while it is open."""
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        if len(uris) > MAX_SUBSCRIPTIONS:
            raise MCPError(
                INVALID_PARAMS, f"at most {MAX_SUBSCRIPTIONS} resources per listen stream"
            )
        held: list[str] = []
        try:
            for uri in uris:
                await self.hold(uri)
                held.append(uri)
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


# --------------------------------------------------------------------------- the server


def _resources_of(row: dict[str, Any]) -> tuple[MCPResource, MCPResource]:
    cid, name = row["id"], row["topic"] or row["id"]
    return (
        MCPResource(
            uri=f"conversation://{cid}/log",
            name=cid,
            title=name,
            description=f"messages.log of {cid} ({row['status']})",
            mime_type="text/plain",
        ),
        MCPResource(
            uri=f"conversation://{cid}/status",
            name=f"{cid}/status",
            title=f"status of {name}",
            description=f"where {cid} stands: status, pending needs, queued messages",
            mime_type="application/json",
        ),
    )


class ContemplationServer(MCPServer[Any]):
    """The SDK's server with the conversations listed as resources, and the subscriptions."""

    def __init__(self, settings: Settings) -> None:
        self.faces = Faces(settings)
        self.subs = Subscriptions(self.faces)
        subs = self.subs

        @asynccontextmanager
        async def lifespan(_: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
            async with anyio.create_task_group() as tg:
                tg.start_soon(subs.run)
                yield {}
                tg.cancel_scope.cancel()

        super().__init__(
            "contemplation",
            instructions=INSTRUCTIONS,
            version=__version__,
            log_level="WARNING",
            lifespan=lifespan,
            subscriptions=subs.bus,
        )
        subs.install(self)

    async def list_resources(self) -> list[MCPResource]:
        with self.faces.lock:
            rows = self.faces.reader.summaries(include_completed=False)
        extra = [res for r in rows for res in _resources_of(r)]
        return [*await super().list_resources(), *extra]


def build_server(settings: Settings) -> ContemplationServer:
    server = ContemplationServer(settings)
    _register_tools(server, server.faces, settings)
    _register_resources(server, server.faces)
    return server


def _register_tools(  # noqa: PLR0915 - one statement per tool and its registration
    mcp: MCPServer[Any], faces: Faces, settings: Settings
) -> None:
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def tool(annotations: ToolAnnotations) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Register with the docstring folded to one line (descriptions stay brief) and the
        result as the one compact text block the tool returns."""

        def register(fn: Callable[P, R]) -> Callable[P, R]:
            doc = " ".join((fn.__doc__ or "").split())
            return mcp.tool(description=doc, annotations=annotations, structured_output=False)(fn)

        return register

    @tool(ToolAnnotations(idempotent_hint=True, open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_start(
        topic: Annotated[str, Field(description="short subject; names the conversation")],
        initial_prompt: Annotated[
            str | None,
            Field(description="the first message to the model; leave out to start empty"),
        ] = None,
        *,
        model: Annotated[
            str | None, Field(description="a model name from conversation_models")
        ] = None,
        backend: Annotated[
            str | None,
            Field(description="ollama, openai, opencode or local (default: configured)"),
        ] = None,
        template: Annotated[
            str | None, Field(description="a template name from conversation_models")
        ] = None,
        context_requirements: Annotated[
            list[str] | None, Field(description="context the model will need")
        ] = None,
        idempotency_key: Annotated[
            str | None, Field(description="a repeat with the same key returns the same id")
        ] = None,
    ) -> str:
        """Start a conversation with a local model and queue the first message. Returns the
        id and a cursor at once; the reply comes later (conversation_wait)."""
        prompt = initial_prompt if initial_prompt and initial_prompt.strip() else None
        conv, created = actions.start(
            settings,
            topic,
            prompt,
            model=model,
            backend=backend,
            template=template,
            context_requirements=context_requirements,
            idempotency_key=idempotency_key,
        )
        alive = daemon_alive(faces.home)
        # a new conversation's blocks all come after 0; a repeat of an earlier start gets
        # what follows the agent's last own message, as a wait without a cursor would
        cursor = 0 if created else faces.last_exchange(conv)
        out: dict[str, Any] = {"conversation_id": conv.id, "created": created, "cursor": cursor}
        out["daemon_alive"] = alive
        if prompt is None:
            out["hint"] = EMPTY_HINT
        elif not alive:
            out["hint"] = faces._hint(conv, Status.PENDING.value, [], alive, empty=False)
        return _json(out)

    @tool(read_only)
    @_errors_as_tool_errors
    def conversation_check(
        conversation_id: Id,
        since: Cursor = None,
        include_own: IncludeOwn = False,
        max_bytes: MaxBytes = paging.PAGE_BYTES,
    ) -> str:
        """Status, activity, what waits for you (`waiting`, each item with the call that
        settles it) and the blocks after `since` (default: your last message); pass the
        returned cursor next time."""
        return _json(
            faces.check(conversation_id, since, include_own=include_own, max_bytes=max_bytes)
        )

    @tool(ToolAnnotations(open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_respond(
        conversation_id: Id,
        response: Annotated[str, Field(description="your answer or message")],
        need: Annotated[
            str | None,
            Field(description="the need's id from `waiting` (or its text); if several wait"),
        ] = None,
        plain: Annotated[
            bool, Field(description="send a plain message even though something waits")
        ] = False,
        since: Annotated[
            int | None, Field(ge=0, description="your cursor, if you hold one: returned as is")
        ] = None,
    ) -> str:
        """Answer a need (kind "need" in `waiting`), or send a plain message when nothing
        waits. Lookups waiting for approval take conversation_approve. Returns a cursor."""
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            done = actions.respond(
                settings, faces.reader, conv, response, need, face="mcp", plain=plain, since=since
            )
        return _json({"conversation_id": conv.id} | done)

    @tool(ToolAnnotations(open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_approve(
        conversation_id: Id,
        decision: Annotated[
            Decision, Field(description="once; always (same tool and arguments, this conversation)")
        ],
        need: Annotated[
            str | None,
            Field(description="the lookup's id from `waiting` (or its need); if several wait"),
        ] = None,
    ) -> str:
        """Allow (once or always) or reject a lookup that waits for approval (kind "approval"
        in `waiting`); the daemon then runs the tool, or tells the model it was refused."""
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            done = actions.approve(
                settings, conv, decision, need, reader=faces.reader, face="mcp"
            )
        return _json({"conversation_id": conv.id} | done)

    @tool(read_only)
    @_errors_as_tool_errors
    def conversation_list(
        status: Annotated[
            str | None,
            Field(
                description="active (default), all, archived, or one status: idle, "
                "awaiting_agent, awaiting_approval, pending, generating, routing, retrying, "
                "error, cancelled, complete"
            ),
        ] = None,
        limit: Annotated[
            int, Field(ge=1, le=LIST_CAP, description=f"conversations per page (max {LIST_CAP})")
        ] = LIST_DEFAULT,
        cursor: Annotated[
            str | None, Field(description="the `cursor` of the previous page, for the next")
        ] = None,
        model: Annotated[str | None, Field(description="only this model")] = None,
        query: Annotated[str | None, Field(description="words the topic contains")] = None,
    ) -> str:
        """One page of conversations, newest activity first (id, topic, status, model, what
        each waits for), the total, and a cursor while more pages exist."""
        return _json(faces.list(status, limit=limit, cursor=cursor, model=model, query=query))

    @tool(ToolAnnotations(destructive_hint=False, open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_cancel(conversation_id: Id) -> str:
        """Stop the generation in flight (or its retries); the turn is marked cancelled."""
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            stopping = actions.cancel(conv)
        if stopping is None:
            state = read_state(conv)
            now = state.status.value if state else Status.PENDING.value
            raise InputRejected(f"nothing to cancel: {conv.id} is {now} (no turn is running)")
        return _json({"conversation_id": conv.id, "cancelling": stopping.value})

    @tool(read_only)
    async def conversation_models() -> str:
        """What conversation_start can name: each backend's models (or why it cannot be
        reached), the defaults, and the templates."""
        return _json(await faces.models())

    @tool(read_only)
    async def conversation_wait(  # noqa: PLR0917 - the SDK passes a tool's arguments by name
        conversation_id: Id,
        since: Cursor = None,
        timeout_s: Annotated[
            float, Field(description=f"seconds, at most {WAIT_CAP:.0f}")
        ] = WAIT_DEFAULT,
        include_own: IncludeOwn = False,
        max_bytes: MaxBytes = paging.PAGE_BYTES,
        ctx: Context | None = None,
    ) -> str:
        """Block until the model has replied and nothing is queued, or at most 50 s (with
        progress notifications); returns what is new, like conversation_check."""

        async def progress(done: float, total: float, line: str) -> None:
            if ctx is not None:
                await ctx.report_progress(done, total, line)

        try:
            return _json(
                await faces.wait(
                    conversation_id,
                    since,
                    timeout_s,
                    include_own=include_own,
                    progress=progress,
                    max_bytes=max_bytes,
                )
            )
        except ContemplationError as exc:
            raise ToolError(str(exc)) from exc

    @tool(ToolAnnotations(destructive_hint=False, open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_reopen(conversation_id: Id) -> str:
        """Bring an archived conversation back to continue it (conversation_respond next)."""
        with faces.lock:
            conv = actions.reopen(faces.home, faces.reader.locate(conversation_id))
        return _json({"conversation_id": conv.id, "archived": False, "path": str(conv.dir)})

    @tool(ToolAnnotations(destructive_hint=False, open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_archive(conversation_id: Id) -> str:
        """Move a finished conversation to completed/ (its files are kept)."""
        conv = faces.reader.locate(conversation_id)
        dest = actions.archive_conversation(faces.home, conv)
        return _json({"conversation_id": dest.id, "archived": True, "path": str(dest.dir)})


def _register_resources(mcp: MCPServer[Any], faces: Faces) -> None:
    @mcp.resource(
        "conversation://{conversation_id}/log",
        name="conversation-log",
        description="A conversation's whole messages.log (rotated segments included)",
        mime_type="text/plain",
    )
    def conversation_log(conversation_id: str) -> str:
        try:
            return log_text(faces.reader.locate(conversation_id))
        except ContemplationError as exc:
            raise ResourceError(str(exc)) from exc

    @mcp.resource(
        "conversation://{conversation_id}/status",
        name="conversation-status",
        description="Where a conversation stands: status, pending needs, queued messages, "
        "last error, whether a daemon runs",
        mime_type="application/json",
    )
    def conversation_status(conversation_id: str) -> str:
        try:
            return faces.status_text(faces.reader.locate(conversation_id))
        except ContemplationError as exc:
            raise ResourceError(str(exc)) from exc


def run(settings: Settings, *, http_port: int | None = None, host: str = "127.0.0.1") -> None:
    server = build_server(settings)
    if http_port is None:
        anyio.run(server.run_stdio_async)
        return
    import socket

    import uvicorn

    try:  # bound before the address is announced: a busy port is one line and exit 1
        sock = socket.create_server((host, http_port))
    except OSError as exc:
        raise ContemplationError(
            f"cannot serve MCP on {host}:{http_port}: {exc.strerror or exc}"
        ) from exc
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(
        app, host=host, port=http_port, log_config=None, access_log=False, log_level="warning"
    )
    print(f"MCP streamable HTTP on http://{host}:{http_port}/mcp", file=sys.stderr)
    uvicorn.Server(config).run(sockets=[sock])
