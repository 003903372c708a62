"""The MCP face for agents: six tools and the conversation logs as resources.

It reads the folder (:mod:`contemplation.reading`) and writes only through
:mod:`contemplation.writer` (via :mod:`contemplation.actions`), so it works whether or not a
daemon runs; no tool waits for inference longer than ``conversation_wait``'s cap.
stdout carries the protocol only (the SDK points fd 1 at stderr while serving; logs go to
stderr).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, Concatenate, ParamSpec, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import Resource as MCPResource
from mcp_types import ToolAnnotations
from pydantic import Field

from contemplation import __version__, actions
from contemplation.conversation import next_action
from contemplation.errors import ContemplationError
from contemplation.layout import (
    Conv,
    Home,
    inbox_entries,
    processing_entries,
    read_metadata,
    read_state,
)
from contemplation.models import BUSY, Status
from contemplation.reading import Reader, log_text, segments
from contemplation.settings import Settings
from contemplation.writer import daemon_alive

WAIT_DEFAULT = 45.0
WAIT_CAP = 50.0
POLL = 0.1

INSTRUCTIONS = """\
Asynchronous conversations with local LLMs. conversation_start queues a first message and
returns at once; conversation_wait (or conversation_check with the returned cursor) picks up
the reply. When the model asks for context (NEED lines), answer with conversation_respond."""

P = ParamSpec("P")
R = TypeVar("R")
Id = Annotated[str, Field(description="conversation id (or a unique prefix)")]
Cursor = Annotated[
    int | None, Field(description="cursor from the previous call; only newer blocks")
]


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


class Faces:
    """The tool bodies, kept apart from the SDK so they are plain, testable functions."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = Home(settings.home)
        self.reader = Reader(self.home)
        self.lock = threading.RLock()  # sync tools run in worker threads; the caches are shared

    # -- helpers ------------------------------------------------------------------------

    def _hint(self, conv: Conv, status: str, pending: list[str], alive: bool) -> str:
        if conv.is_completed:
            return "This conversation is archived; start a new one to continue."
        if not alive:
            return (
                f"No contemplation daemon is running on {self.home.root}: messages stay queued "
                "until one starts (`contemplation run`, or `contemplation service install`)."
            )
        if pending:
            return "The model waits for context: answer with conversation_respond."
        if status in {s.value for s in BUSY}:
            return "The model is working: conversation_wait returns when it replies."
        if status == Status.ERROR.value:
            return "The last turn failed: send a message with conversation_respond to try again."
        return ""

    @_locked
    def check(self, conversation_id: str, since: int | None = None) -> dict[str, Any]:
        conv = self.reader.locate(conversation_id)
        meta = read_metadata(conv)
        state = read_state(conv)
        got = self.reader.since(conv, since or 0)
        pending = (
            self.reader.pending_needs(conv, meta)
            if meta is not None and not conv.is_completed
            else []
        )
        status = state.status.value if state else Status.PENDING.value
        alive = daemon_alive(self.home)
        out: dict[str, Any] = {
            "conversation_id": conv.id,
            "topic": meta.topic if meta else "",
            "status": status,
            "archived": conv.is_completed,
            "model": meta.model if meta else "",
            "pending_needs": pending,
            "queued_messages": len(inbox_entries(conv)) + len(processing_entries(conv)),
            "blocks": got.blocks,
            "cursor": got.cursor,
            "last_error": state.last_error.model_dump() if state and state.last_error else None,
            "daemon_alive": alive,
        }
        if got.partial is not None:
            out["in_progress"] = got.partial
        if got.reset:
            out["cursor_reset"] = True
        hint = self._hint(conv, status, pending, alive)
        if hint:
            out["hint"] = hint
        return out

    @_locked
    def settled(self, conv: Conv) -> bool:
        """Nothing queued, nothing being written, and no model turn due."""
        if conv.is_completed:
            return True
        if not conv.dir.is_dir() or inbox_entries(conv) or processing_entries(conv):
            return False
        state = read_state(conv)
        meta = read_metadata(conv)
        if state is None or meta is None or state.intent is not None or state.status in BUSY:
            return False
        view = self.reader.view(conv, meta.agent_label).refresh()
        return next_action(view.blocks).action != "turn"

    @_locked
    def last_exchange(self, conv: Conv) -> int:
        """Cursor of the agent's latest block (what "new" means when no cursor is given)."""
        meta = read_metadata(conv)
        view = self.reader.view(conv, meta.agent_label if meta else "CLAUDE")
        view.refresh()
        live_start = segments(conv)[-1].start
        agent = [b for b in view.live.blocks if b.kind.value == "agent"]
        return live_start + (agent[-1].offset if agent else 0)

    @_locked
    def replied_since(self, conv: Conv, since: int) -> bool:
        got = self.reader.since(conv, since)
        return any(b.get("kind") == "model" for b in got.blocks)

    async def wait(
        self, conversation_id: str, since: int | None = None, timeout_s: float = WAIT_DEFAULT
    ) -> dict[str, Any]:
        budget = min(max(float(timeout_s), 0.0), WAIT_CAP)
        deadline = time.monotonic() + budget
        conv = self.reader.locate(conversation_id)
        timed_out = False
        while True:
            if not conv.dir.is_dir():  # archived meanwhile
                conv = self.reader.locate(conv.id)
            if self.settled(conv) or (since is not None and self.replied_since(conv, since)):
                break
            if not daemon_alive(self.home):
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            await anyio.sleep(POLL)
        cursor = since if since is not None else self.last_exchange(conv)
        out = self.check(conv.id, cursor)
        out["timed_out"] = timed_out
        if timed_out:
            out["hint"] = "Still working: call conversation_wait again with the returned cursor."
        return out

    @_locked
    def list(self, status: str | None = None) -> dict[str, Any]:
        want = (status or "").strip().lower()
        with_completed = want in {"all", "complete", "completed", "archived"}
        rows = self.reader.summaries(include_completed=with_completed)
        if want in {"archived", "completed"}:
            rows = [r for r in rows if r["completed"]]
        elif want not in {"", "all"}:
            rows = [r for r in rows if r["status"] == want]
        keys = ("id", "topic", "status", "model", "backend", "last_activity", "pending_needs")
        return {
            "conversations": [{k: r[k] for k in keys} | {"archived": r["completed"]} for r in rows],
            "count": len(rows),
        }


def build_server(settings: Settings) -> MCPServer[Any]:
    faces = Faces(settings)

    class Server(MCPServer[Any]):
        async def list_resources(self) -> list[MCPResource]:
            with faces.lock:
                rows = faces.reader.summaries(include_completed=False)
            extra = [
                MCPResource(
                    uri=f"conversation://{r['id']}/log",
                    name=r["id"],
                    title=r["topic"] or r["id"],
                    description=f"messages.log of {r['id']} ({r['status']})",
                    mime_type="text/plain",
                )
                for r in rows
            ]
            return [*await super().list_resources(), *extra]

    mcp = Server(
        "contemplation", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING"
    )
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def tool(annotations: ToolAnnotations) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Register with the docstring folded to one line (descriptions stay brief)."""

        def register(fn: Callable[P, R]) -> Callable[P, R]:
            doc = " ".join((fn.__doc__ or "").split())
            return mcp.tool(description=doc, annotations=annotations)(fn)

        return register

    @tool(ToolAnnotations(idempotent_hint=True, open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_start(
        topic: Annotated[str, Field(description="short subject; names the conversation")],
        initial_prompt: Annotated[str, Field(description="the first message to the model")],
        *,
        model: str | None = None,
        backend: str | None = None,
        template: str | None = None,
        context_requirements: Annotated[
            list[str] | None, Field(description="context the model will need")
        ] = None,
        idempotency_key: Annotated[
            str | None, Field(description="a repeat with the same key returns the same id")
        ] = None,
    ) -> dict[str, Any]:
        """Start a conversation with a local model and queue the first message. Returns the
        id at once; the reply comes later (conversation_wait)."""
        conv, created = actions.start(
            settings,
            topic,
            initial_prompt,
            model=model,
            backend=backend,
            template=template,
            context_requirements=context_requirements,
            idempotency_key=idempotency_key,
        )
        alive = daemon_alive(faces.home)
        out: dict[str, Any] = {
            "conversation_id": conv.id,
            "created": created,
            "daemon_alive": alive,
        }
        if not alive:
            out["hint"] = faces._hint(conv, "pending", [], alive)
        return out

    @tool(read_only)
    @_errors_as_tool_errors
    def conversation_check(conversation_id: Id, since: Cursor = None) -> dict[str, Any]:
        """Status, pending needs, last error and the blocks after `since`; pass the returned
        cursor next time to get only what is new."""
        return faces.check(conversation_id, since)

    @tool(ToolAnnotations(open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_respond(
        conversation_id: Id,
        response: Annotated[str, Field(description="your answer or message")],
        need: Annotated[
            str | None, Field(description="which pending need (text or 1-based number)")
        ] = None,
    ) -> dict[str, Any]:
        """Answer the need the model waits for (the first, or `need`); when nothing is pending,
        send `response` as a plain message."""
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            done = actions.respond(settings, faces.reader, conv, response, need)
        return {"conversation_id": conv.id} | done

    @tool(read_only)
    @_errors_as_tool_errors
    def conversation_list(
        status: Annotated[
            str | None,
            Field(description="a status (idle, awaiting_agent, error, ...), 'archived' or 'all'"),
        ] = None,
    ) -> dict[str, Any]:
        """Conversations with status, model and last activity (active ones by default)."""
        return faces.list(status)

    @tool(read_only)
    async def conversation_wait(
        conversation_id: Id,
        since: Cursor = None,
        timeout_s: Annotated[
            float, Field(description=f"seconds, at most {WAIT_CAP:.0f}")
        ] = WAIT_DEFAULT,
    ) -> dict[str, Any]:
        """Block until the model has replied and nothing is queued, or the time is up; returns
        what is new (like conversation_check)."""
        try:
            return await faces.wait(conversation_id, since, timeout_s)
        except ContemplationError as exc:
            raise ToolError(str(exc)) from exc

    @tool(ToolAnnotations(destructive_hint=False, open_world_hint=False))
    @_errors_as_tool_errors
    def conversation_archive(conversation_id: Id) -> dict[str, Any]:
        """Move a finished conversation to completed/ (its files are kept)."""
        conv = faces.reader.locate(conversation_id)
        dest = actions.archive_conversation(faces.home, conv)
        return {"conversation_id": dest.id, "archived": True, "path": str(dest.dir)}

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

    return mcp


def run(settings: Settings, *, http_port: int | None = None, host: str = "127.0.0.1") -> None:
    server = build_server(settings)
    if http_port is None:
        anyio.run(server.run_stdio_async)
        return
    import uvicorn

    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(
        app, host=host, port=http_port, log_config=None, access_log=False, log_level="warning"
    )
    print(f"MCP streamable HTTP on http://{host}:{http_port}/mcp", file=sys.stderr)
    uvicorn.Server(config).run()
