"""The dashboard's Starlette app: a static page and the JSON API under ``/api/`` behind it.

Reads go through :class:`contemplation.faces.reading.Reader` (in a worker thread, one at a time, so
the daemon's event loop never waits on a big log); actions go through
:mod:`contemplation.faces.actions` (and so through the writer). :mod:`.security` guards every route.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from contemplation.base.exits import disk_full
from contemplation.errors import (
    AlreadyDecided,
    Ambiguous,
    ContemplationError,
    InputRejected,
    LockBusy,
    NotFound,
)
from contemplation.faces import actions, bearer, decisions
from contemplation.faces.card import Seen
from contemplation.faces.dashboard import cards, export
from contemplation.faces.dashboard.live import Broker
from contemplation.faces.dashboard.security import Guard, allowed_hosts
from contemplation.faces.reading import Reader
from contemplation.index import embedder, fusion, listing
from contemplation.index.search import Filters, as_typed
from contemplation.models import CANCELLABLE
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.writer import daemon_alive

log = structlog.get_logger("contemplation.dashboard")

STATIC = Path(str(resources.files("contemplation.faces.dashboard").joinpath("static")))
HEARTBEAT = 15.0
SEARCHES_AT_ONCE = 4  # running or waiting; more get 429
SEARCH_HITS = 50
MAX_QUERY_CHARS = 200
PAGE_ROWS = 100  # the list's page when the browser does not say
MAX_PAGE_ROWS = 500
BODY_SLACK = 64 * 1024  # a JSON body may exceed max_message_bytes by its escaping and fields
FULL_RETRY_AFTER = 30  # s: a 507 (the disk is full) asks to be tried again after that
T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Response]]


def _status_of(exc: ContemplationError) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Ambiguous | LockBusy | AlreadyDecided):
        return 409
    if isinstance(exc, InputRejected):
        return 422
    return 400


class Dashboard:
    def __init__(
        self,
        settings: Settings,
        *,
        token: str,
        broker: Broker | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.home = Home(settings.home)
        self.reader = Reader(self.home)
        self.broker = broker or Broker()
        self.token = token
        self.stop = stop or asyncio.Event()
        self.host = settings.dashboard_host
        self.port = settings.dashboard_port
        self.started = time.time()
        self._lock = threading.Lock()
        self._searches = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    # -- plumbing -----------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        def locked() -> T:
            with self._lock:
                return fn()

        return await anyio.to_thread.run_sync(locked)

    async def _call(self, fn: Callable[[], Any]) -> Response:
        try:
            data = await self._run(fn)
        except Exception as exc:
            failed = self._failed(exc)
            if failed is None:
                raise
            return failed
        if isinstance(data, Response):
            return data
        return JSONResponse(data, headers={"cache-control": "no-store"})

    def _failed(self, exc: Exception) -> Response | None:
        """The answer to an action or read that raised ``exc`` (None: a bug, a 500). A full
        disk, however the error came up, is a 507 that says so and where, as the CLI's one
        line does: every write is whole or not made, so nothing was recorded."""
        full = disk_full(exc)
        if full is not None:
            where = full.filename if isinstance(full, OSError) and full.filename else None
            return JSONResponse(
                {"error": f"the disk is full: {where or self.home.root}"},
                status_code=507,
                headers={"retry-after": str(FULL_RETRY_AFTER), "cache-control": "no-store"},
            )
        if isinstance(exc, ContemplationError):
            return JSONResponse({"error": str(exc)}, status_code=_status_of(exc))
        if isinstance(exc, OSError):
            return JSONResponse({"error": f"{exc.strerror or exc}"}, status_code=500)
        return None

    def _conv(self, request: Request) -> Conv:
        return self.reader.locate(str(request.path_params["conv_id"]))

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise InputRejected("the body is not JSON") from exc
        if not isinstance(data, dict):
            raise InputRejected("the body must be a JSON object")
        return data

    # -- pages and reads ----------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    async def favicon(self, request: Request) -> Response:
        return FileResponse(
            STATIC / "favicon.svg",
            media_type="image/svg+xml",
            headers={"cache-control": "max-age=86400"},
        )

    async def health(self, request: Request) -> Response:
        """Alive, to anyone who reaches the port (``{"ok": true}``); the pid, the uptime,
        whether the daemon runs and the home's path only with the token."""
        said: dict[str, Any] = {"ok": True}
        if bearer.matches(bearer.given(request.headers), self.token):
            said |= {
                "pid": os.getpid(),
                "daemon_alive": daemon_alive(self.home),
                "uptime_s": round(time.time() - self.started, 1),
                "home": str(self.home.root),
            }
        return JSONResponse(said, headers={"cache-control": "no-store"})

    def status_data(self) -> dict[str, Any]:
        counts = listing.counts(self.home)
        return {
            "home": str(self.home.root),
            "daemon_running": daemon_alive(self.home),
            "active": counts["active"],
            "completed": counts["completed"],
            "disk_active_bytes": counts["active_bytes"],
            "disk_completed_bytes": counts["completed_bytes"],
            "dashboard": self.url,
        }

    async def status(self, request: Request) -> Response:
        return await self._call(self.status_data)

    async def conversations(self, request: Request) -> Response:
        """``GET /api/conversations?status=&q=&limit=&cursor=``: a page of summaries from the
        index, newest activity first; ``cursor`` continues where the last page ended."""
        params = request.query_params
        status = params.get("status", "").strip()
        scope = status if status in {"active", "archived"} else "all"
        q = listing.Query(
            scope=scope,
            status="" if status in {"", "active", "archived"} else status,
            words=params.get("q", ""),
        )
        try:
            limit = min(max(int(params.get("limit", PAGE_ROWS)), 1), MAX_PAGE_ROWS)
        except ValueError:
            return JSONResponse({"error": "limit must be a number"}, status_code=400)
        cursor = params.get("cursor") or None

        def rows() -> dict[str, Any]:
            page = listing.page(self.home, q, limit, cursor)
            return {
                "conversations": page.rows,
                "count": len(page.rows),
                "total": page.total,
                "cursor": page.cursor,
            }

        return await self._call(rows)

    async def search(self, request: Request) -> Response:
        """``GET /api/search?q=TEXT``: every log's full text, from the index (each hit a block,
        best first; archived conversations too). A few at a time, each in a worker thread."""
        query = request.query_params.get("q", "").strip()
        if not query or len(query) > MAX_QUERY_CHARS:
            return JSONResponse(
                {"error": f"the search needs a query of 1 to {MAX_QUERY_CHARS} characters: ?q="},
                status_code=400,
            )
        if self._searches >= SEARCHES_AT_ONCE:
            return JSONResponse(
                {"error": "too many searches at once; try again in a moment"},
                status_code=429,
                headers={"retry-after": "1"},
            )
        self._searches += 1
        cancel = threading.Event()  # the browser went away, or the server stops
        try:
            filters = Filters(archived=True)
            typed = as_typed(query)
            seconds = self.settings.search_seconds
            embedder.configure(*self.settings.semantic.server())  # [semantic]: theirs
            watch = asyncio.ensure_future(self._cancel_when_gone(request, cancel))
            try:
                mode = request.query_params.get("mode", "")  # words, meaning, both
                page = await anyio.to_thread.run_sync(
                    lambda: fusion.search(
                        self.home, query, filters, SEARCH_HITS, mode=mode, words=typed,
                        seconds=seconds, cancel=cancel,
                    )
                )
            finally:
                watch.cancel()
        except InputRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        finally:
            self._searches -= 1
        if cancel.is_set() and page.found.cut:
            log.info("search_cancelled", query=query[:80], why=page.found.cut)
        return JSONResponse(page.as_dict(), headers={"cache-control": "no-store"})

    async def _cancel_when_gone(self, request: Request, cancel: threading.Event) -> None:
        """Set ``cancel`` once the client has gone (a newer keystroke aborted its fetch: the
        server is told the connection closed) or the server stops: the search's thread then
        ends within a millisecond, its slot free, instead of running to its bound."""
        stopping = asyncio.ensure_future(self.stop.wait())
        told: asyncio.Future[Any] | None = None
        try:
            while True:
                told = asyncio.ensure_future(request.receive())  # a GET's: only its end
                await asyncio.wait({told, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if stopping.done() or told.result()["type"] == "http.disconnect":
                    cancel.set()
                    return
        finally:
            stopping.cancel()
            if told is not None:
                told.cancel()

    async def conversation(self, request: Request) -> Response:
        def detail() -> dict[str, Any]:
            conv = self._conv(request)
            out = dict(self.reader.summary(conv))
            view = self.reader.standing(conv)  # what waits and the state: one reading
            meta, state, items = view.meta, view.state, view.items
            out["waiting"] = [i.as_dict(conv.id, "cli") for i in items]
            out["pending_needs"] = [i.need for i in items if i.kind == "need"]
            out["template"] = meta.template if meta else ""
            out["cancel_requested"] = os.path.lexists(conv.cancel_flag)
            asked = {r.id: r for r in state.pending_approvals} if state is not None else {}
            out["pending_approvals"] = [
                asked[i.id].model_dump(mode="json") for i in items if i.id in asked
            ]
            out["queued_messages"] = view.queued
            out["decisions"] = decisions.page(self.home, only=conv)["decisions"]  # who, when
            out["activity"] = self.reader.activity(conv, view)  # the words of status and MCP
            out["actions"] = available_actions(out)
            out["agent_label"] = meta.agent_label if meta else "CLAUDE"
            out["panel"] = [s.model_dump(mode="json") for s in meta.seats()] if meta else []
            if state is not None:
                out["last_turn"] = state.last_turn.model_dump() if state.last_turn else None
                out["warnings"] = state.warnings
                out["parse_errors"] = state.parse_errors
            return out

        return await self._call(detail)

    async def blocks(self, request: Request) -> Response:
        try:
            since = int(request.query_params.get("since", "0"))
        except ValueError:
            return JSONResponse({"error": "since must be an integer"}, status_code=400)

        def read() -> dict[str, Any]:
            got = self.reader.since(self._conv(request), since, thinking=True)
            return {
                "blocks": got.blocks,
                "cursor": got.cursor,
                "partial": got.partial,
                "reset": got.reset,
            }

        return await self._call(read)

    async def export_md(self, request: Request) -> Response:
        return await self._export(request, "md")

    async def export_json(self, request: Request) -> Response:
        return await self._export(request, "json")

    async def _export(self, request: Request, kind: str) -> Response:
        def build() -> Response:
            conv = self._conv(request)
            text = export.as_markdown(conv) if kind == "md" else export.as_json(conv)
            media = "text/markdown" if kind == "md" else "application/json"
            return Response(
                text,
                media_type=f"{media}; charset=utf-8",
                headers={
                    "content-disposition": f'attachment; filename="{conv.id}.{kind}"',
                    "cache-control": "no-store",
                },
            )

        return await self._call(build)

    async def metrics(self, request: Request) -> Response:
        live = self.broker.metrics.snapshot()
        return await self._call(lambda: cards.metrics(self.home, live))

    async def card_rows(self, request: Request) -> Response:
        """Every card's title and rows (``dashboard/cards.py``), drawn by the page as text;
        ``/api/panels`` is the same under its former name (``{"panels": [...]}``)."""
        seen = Seen(self.home, self.broker.metrics.snapshot())
        # on threads of their own, bounded, outside the lock the other reads take: a card
        # that sleeps holds nothing else
        shown = await cards.shown(seen)
        key = "panels" if request.url.path.endswith("/panels") else "cards"
        return JSONResponse({key: shown}, headers={"cache-control": "no-store"})

    async def events(self, request: Request) -> Response:
        conv = request.query_params.get("conv") or None
        if len(self.broker.subs) >= self.settings.dashboard_max_subscribers:
            return JSONResponse(  # an idle client cannot hold more than its share
                {"error": "too many live event streams; try again later"},
                status_code=503,
                headers={"retry-after": "5"},
            )
        return StreamingResponse(
            self._stream(conv),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def _stream(self, conv: str | None) -> AsyncIterator[str]:
        sub = self.broker.subscribe(conv)
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            yield "retry: 2000\nevent: hello\ndata: {}\n\n"
            while not self.stop.is_set():
                getter = asyncio.ensure_future(sub.queue.get())
                done, _ = await asyncio.wait(
                    {getter, stopping}, timeout=HEARTBEAT, return_when=asyncio.FIRST_COMPLETED
                )
                if getter not in done:
                    getter.cancel()
                    if not done:
                        yield ": ping\n\n"
                    continue
                conv_id, event, data = getter.result()
                if sub.overflowed:
                    sub.overflowed = False
                    yield "event: resync\ndata: {}\n\n"
                payload = json.dumps({"conv": conv_id, **data}, ensure_ascii=False)
                yield f"event: {event}\ndata: {payload}\n\n"
        finally:
            stopping.cancel()
            self.broker.unsubscribe(sub)

    # -- actions ------------------------------------------------------------------------

    async def send(self, request: Request) -> Response:
        try:
            body = await self._body(request)
        except InputRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

        def send() -> dict[str, Any]:
            conv = self._conv(request)
            left = [i.as_dict(conv.id, "cli") for i in self.reader.waiting(conv)]
            # sent past what waits: the person is told what stays unanswered (CLI: --plain)
            return {"queued": actions.send(self.settings, conv, _text(body))} | {
                "left_unanswered": left
            }

        return await self._call(send)

    async def respond(self, request: Request) -> Response:
        try:
            body = await self._body(request)
        except InputRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        need = body.get("need")
        return await self._call(
            lambda: actions.respond(
                self.settings,
                self.reader,
                self._conv(request),
                _text(body),
                str(need) if need not in (None, "") else None,
            )
        )

    async def approve(self, request: Request) -> Response:
        """``{"decision": "once" | "always" | "reject", "need": its id or text}``."""
        try:
            body = await self._body(request)
        except InputRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        decision, need = body.get("decision"), body.get("need")
        if not isinstance(decision, str):
            return JSONResponse(
                {"error": "the body needs a decision: once, always or reject"}, status_code=400
            )
        return await self._call(
            lambda: actions.approve(
                self.settings,
                self._conv(request),
                decision,
                str(need) if need not in (None, "") else None,
                reader=self.reader,
                face="dashboard",
            )
        )

    async def revoke(self, request: Request) -> Response:
        """``{"id": a decision's id}``: revoke that ``always`` (recorded as the dashboard's)."""
        try:
            body = await self._body(request)
        except InputRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        ref = body.get("id")
        if not isinstance(ref, str) or not ref.strip():
            return JSONResponse({"error": "the body needs the decision's id"}, status_code=400)
        return await self._call(
            lambda: decisions.revoke(
                self.settings, ref, only=self._conv(request), face="dashboard"
            )
        )

    async def cancel(self, request: Request) -> Response:
        def run() -> Response:
            conv = self._conv(request)
            stopping = actions.cancel(conv)
            if stopping is None:
                state = read_state(conv)
                now = state.status.value if state else "pending"
                return JSONResponse(
                    {"error": f"nothing is running in {conv.id} (status {now}); nothing to cancel"},
                    status_code=409,
                )
            return JSONResponse(
                {"cancelling": stopping.value}, headers={"cache-control": "no-store"}
            )

        return await self._call(run)

    async def archive(self, request: Request) -> Response:
        def run() -> dict[str, Any]:
            dest = actions.archive_conversation(self.home, self._conv(request))
            return {"archived": True, "id": dest.id}

        return await self._call(run)

    async def fork(self, request: Request) -> Response:
        """``{"offset": a block's cursor}`` (what the page's blocks carry) or ``{"at": N}``,
        and ``"topic"`` if wanted: a new conversation from the blocks up to that one. It
        waits for the next message unless ``"rerun": true`` (see :func:`fork.fork`)."""
        try:
            body = await self._body(request)
            at, offset, topic = (_whole(body, "at"), _whole(body, "offset"), body.get("topic"))
            rerun = body.get("rerun", False)
        except InputRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if not isinstance(rerun, bool):
            return JSONResponse({"error": "rerun is true or false"}, status_code=400)

        def run() -> dict[str, Any]:
            from contemplation.faces import fork

            done = fork.fork(
                self.home,
                self._conv(request),
                at=at,
                offset=offset,
                topic=topic if isinstance(topic, str) else None,
                durable=self.settings.durability == "fsync",
                rerun=rerun,
            )
            return done.as_dict()

        return await self._call(run)

    # -- the app ------------------------------------------------------------------------

    def actions(self) -> dict[str, Handler]:
        """The write endpoints: ``POST /api/conversations/{id}/<name>``, each behind the
        Guard's token, Origin, content-type and body-size rules. A new action is one entry
        here and one case in :func:`available_actions`."""
        return {
            "messages": self.send,
            "respond": self.respond,
            "approve": self.approve,
            "revoke": self.revoke,  # offered on each standing decision, not in available_actions
            "cancel": self.cancel,
            "archive": self.archive,
            "fork": self.fork,  # offered on every block, not in available_actions
        }

    def asgi(self) -> ASGIApp:
        c = "/api/conversations/{conv_id}"
        routes = [
            Route("/", self.page),
            Route("/c/{conv_id}", self.page),
            Route("/favicon.ico", self.favicon),
            Route("/health", self.health),
            Route("/api/status", self.status),
            Route("/api/metrics", self.metrics),
            Route("/api/cards", self.card_rows),
            Route("/api/panels", self.card_rows),  # the former name (deprecated)
            Route("/api/events", self.events),
            Route("/api/search", self.search),
            Route("/api/conversations", self.conversations),
            Route(c, self.conversation),
            Route(c + "/blocks", self.blocks),
            Route(c + "/export.md", self.export_md),
            Route(c + "/export.json", self.export_json),
            *(Route(f"{c}/{name}", fn, methods=["POST"]) for name, fn in self.actions().items()),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
        return Guard(
            Starlette(routes=routes, exception_handlers={HTTPException: _http_error}),
            token=lambda: self.token,
            hosts=lambda: allowed_hosts(self.host, self.port),
            max_body=2 * self.settings.max_message_bytes + BODY_SLACK,
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route: 404, wrong method: 405) as JSON too."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def available_actions(detail: dict[str, Any]) -> list[str]:
    """What the page may offer for a conversation now (the endpoints still check)."""
    if detail.get("completed"):
        return []
    out = ["messages"]
    kinds = {item["kind"] for item in detail.get("waiting", [])}  # waiting.items, as dicts
    if "need" in kinds:  # respond refuses a lookup's id, approve a need's
        out.append("respond")
    if "approval" in kinds:
        out.append("approve")
    if detail.get("status") in CANCELLABLE:  # what actions.cancel stops (409 otherwise)
        out.append("cancel")
    if detail.get("status") not in CANCELLABLE and not detail.get("queued_messages"):
        out.append("archive")  # what archive refuses: a turn in flight or a message queued
    return out


def _text(body: dict[str, Any]) -> str:
    text = body.get("text")
    if not isinstance(text, str):
        raise InputRejected("the body needs a text field (a string)")
    return text


def _whole(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputRejected(f"{key} must be a whole number")
    return value
