"""The MCP face for agents: the SDK's wiring of the tools (their bodies are in
:mod:`contemplation.faces.mcp.calls`) and of each conversation's log and status as resources a
client can subscribe to (:mod:`contemplation.faces.mcp.subscriptions`).

It reads the folder (:mod:`contemplation.faces.reading`) and writes only through
:mod:`contemplation.writer` (via :mod:`contemplation.faces.actions`), so it works whether or not a
daemon runs; no tool waits for inference longer than ``conversation_wait``'s cap.

A tool's result is one compact JSON text block and nothing else: no indentation, and no
``structuredContent`` copy of the same object (Claude Code and VS Code show the structured copy
*instead of* the text when both are there, other clients only the text; one block means every
client sees the same thing once).

stdout carries the protocol only (the SDK points fd 1 at stderr while serving; logs go to
stderr).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec, TypeVar

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    InputRequiredResult,
    ListResourcesResult,
    PaginatedRequestParams,
    ToolAnnotations,
)
from mcp_types import Resource as MCPResource
from pydantic import Field, ValidationError

from contemplation import __version__
from contemplation.base.secret_names import MCP_TOKEN
from contemplation.errors import ContemplationError, InputRejected
from contemplation.faces import actions, bearer
from contemplation.faces.mcp import connect
from contemplation.faces.mcp.arguments import checked, refused
from contemplation.faces.mcp.calls import (
    EMPTY_HINT,
    LIST_CAP,
    LIST_DEFAULT,
    WAIT_CAP,
    WAIT_DEFAULT,
    Faces,
    Limits,
    _json,
)
from contemplation.faces.mcp.elicit import shows_forms, takes_forms, wait_asking
from contemplation.faces.mcp.subscriptions import Subscriptions
from contemplation.faces.mcp.task_push import TaskPush
from contemplation.faces.mcp.tasks import TasksExtension, declared
from contemplation.faces.reading import log_text
from contemplation.index import listing
from contemplation.models import Decision, Status
from contemplation.protocol import paging, structured
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_metadata, read_state
from contemplation.writer import daemon_alive, ensure_home

INSTRUCTIONS = """\
Asynchronous conversations with local LLMs. conversation_start queues a first message and
returns a cursor at once; conversation_wait (or conversation_check) with the latest returned
cursor picks up the reply. A client that declares the io.modelcontextprotocol/tasks extension
gets a task instead: its result is the reply, so it need not call conversation_wait or
conversation_check. When the model stops for you, `waiting` lists each item with its id
and the call that settles it: a need (answer with conversation_respond) or a lookup waiting
for approval, which is the person's: a client that shows forms asks them (conversation_wait
or the task puts the form); only without forms decide with conversation_approve.
Subscribe to conversation://<id>/status or /log to be told when a conversation changes."""
TOKEN_FILE = MCP_TOKEN

P = ParamSpec("P")
R = TypeVar("R")
Id = Annotated[str, Field(description="conversation id (or a unique prefix)")]
Attachments = Annotated[
    list[str] | None,
    Field(description="paths of files the message carries: images, or text files inlined"),
]
Schema = Annotated[
    dict[str, Any] | None,
    Field(
        description="a JSON Schema the reply must match (the message is then a plain message);"
        " check/wait return the reply parsed as `parsed`"
    ),
]


def _with_schema(text: str | None, schema: dict[str, Any] | None, limit: int) -> str | None:
    """The message that asks for a reply matching ``schema`` (its SCHEMA: line first)."""
    if schema is None:
        return text
    if text is None:
        raise InputRejected("a schema goes with a message: give the message too")
    return structured.with_schema(text, structured.check_schema(schema, limit))


Cursor = Annotated[
    int | None, Field(ge=0, description="cursor from the previous call; only newer blocks")
]
MaxBytes = Annotated[
    int,
    Field(
        ge=paging.PAGE_FLOOR,
        le=paging.PAGE_CAP,
        description="most bytes of blocks in one result (and at most 20,000 estimated "
        "tokens); a cut page continues at its cursor",
    ),
]
IncludeOwn = Annotated[
    bool, Field(description="also return your own messages and answers (left out by default)")
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

    def __init__(self, settings: Settings, limits: Limits | None = None) -> None:
        self.faces = Faces(settings, limits)
        self.subs = Subscriptions(self.faces)
        subs = self.subs
        tasks = TasksExtension(self.faces)
        subs.push = TaskPush(tasks.tasks, subs.bus).listen  # listen streams with task ids

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
            extensions=[tasks],  # tasks to a client that takes them
        )
        subs.install(self)
        self.aliases: dict[str, dict[str, str]] = {}  # tool → {alias: the argument it names}
        self._takes: dict[str, list[str]] = {}  # tool → its arguments, as its schema lists them

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """The SDK's call with the arguments checked first
        (:mod:`contemplation.faces.mcp.arguments`):
        pydantic ignores a name it does not know (a misnamed cursor was quietly the default,
        and an agent paged through page one forever), and its own errors are several lines
        with a URL in them."""
        if name not in self._takes:  # read once, again only for a name not seen yet
            tools = await self.list_tools()
            self._takes = {t.name: list(t.input_schema.get("properties", {})) for t in tools}
        takes = self._takes.get(name)
        if takes is None:  # not a tool: the SDK says so
            return await super().call_tool(name, arguments, context)
        try:
            args, said = checked(arguments, takes, self.aliases.get(name, {}))
        except ContemplationError as exc:
            raise ToolError(str(exc)) from exc
        try:
            return await super().call_tool(name, args, context)
        except ToolError as exc:  # the arguments' values, refused before the tool ran
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                raise ToolError(refused(cause, said)) from cause
            raise

    async def _handle_list_resources(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        """resources/list a page at a time (MCP pagination): the active conversations, newest
        activity first, ``Limits.resources_page`` of them (two resources each) per page, and
        ``nextCursor`` while more follow; the server's own resources head the first page.
        The cursor is the keyset of ``list --cursor``, so a conversation that moves between
        two pages is neither lost nor listed twice. (The SDK's handler lists everything.)"""
        cursor = params.cursor if params is not None else None
        try:
            with self.faces.lock:
                page = listing.page(
                    self.faces.home,
                    listing.Query(scope="active"),
                    self.faces.limits.resources_page,
                    cursor,
                )
        except InputRejected as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from exc
        fixed = [] if cursor else await super().list_resources()
        extra = [res for r in page.rows for res in _resources_of(r)]
        return ListResourcesResult(resources=[*fixed, *extra], next_cursor=page.cursor)


def build_server(settings: Settings, limits: Limits | None = None) -> ContemplationServer:
    """The MCP server over ``settings``; ``limits`` bound its waits and subscriptions."""
    server = ContemplationServer(settings, limits)
    _register_tools(server, server.faces, settings)
    _register_resources(server, server.faces)
    return server


def _register_tools(mcp: ContemplationServer, faces: Faces, settings: Settings) -> None:
    """Every tool of :data:`_TOOLS`, in its order (the order tools/list gives), with its
    docstring folded to one line (descriptions stay brief) and its result as the one compact
    text block the tool returns; ``aliases``: other names an argument is accepted under (not
    in the schema)."""
    for made in _TOOLS:
        fn = made.make(faces, settings)
        doc = " ".join((fn.__doc__ or "").split())
        mcp.aliases[fn.__name__] = dict(made.aliases)
        mcp.tool(description=doc, annotations=made.annotations, structured_output=False)(fn)


@dataclass(frozen=True, slots=True)
class _Tool:
    """One MCP tool: what makes its function (over the server's faces and settings), its
    annotations, and the other names an argument is accepted under."""

    make: Callable[[Faces, Settings], Callable[..., Any]]
    annotations: ToolAnnotations
    aliases: Mapping[str, str] = field(default_factory=dict)


_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_UNDOABLE = ToolAnnotations(destructive_hint=False, open_world_hint=False)  # changes, loses nothing
_PAGING = {"since": "cursor"}  # the name these tools' cursor had before


def _conversation_start(faces: Faces, settings: Settings) -> Callable[..., Any]:
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
        attachments: Attachments = None,
        schema: Schema = None,
        models: Annotated[
            list[str] | None,
            Field(description="two or more models: a panel, each answering every message"),
        ] = None,
        debate: Annotated[
            bool, Field(description="a panel: each also sees the others' last answers")
        ] = False,
        synthesize: Annotated[
            str | None, Field(description="a panel: this model adds a reply weighing them")
        ] = None,
    ) -> str:
        """Start a conversation with a local model and queue the first message. Returns the
        id and a cursor at once; the reply comes later (conversation_wait)."""
        prompt = initial_prompt if initial_prompt and initial_prompt.strip() else None
        if models and len(models) == 1:  # one model: an ordinary conversation
            model, models = model or models[0], None
        ask = actions.PanelAsk(tuple(models or ()), debate, synthesize)
        files = faces.attached(attachments or (), template or settings.default_template)
        prompt = _with_schema(prompt, schema, settings.max_schema_bytes)
        conv, created = actions.start(
            settings,
            topic,
            prompt,
            model=model,
            backend=backend,
            template=template,
            context_requirements=context_requirements,
            idempotency_key=idempotency_key,
            files=files,
            started_by="mcp",  # the agent's: `contemplation watch --agent` follows it
            ask=ask,
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

    return conversation_start


def _conversation_check(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_check(
        conversation_id: Id,
        cursor: Cursor = None,
        include_own: IncludeOwn = False,
        max_bytes: MaxBytes = paging.PAGE_BYTES,
    ) -> str:
        """Status, activity, what waits for you (`waiting`, each item with the call that
        settles it) and the blocks after `cursor` (default: your last message); pass the
        returned cursor next time."""
        return _json(
            faces.check(conversation_id, cursor, include_own=include_own, max_bytes=max_bytes)
        )

    return conversation_check


def _conversation_respond(faces: Faces, settings: Settings) -> Callable[..., Any]:
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
        cursor: Annotated[
            int | None, Field(ge=0, description="your cursor, if you hold one: returned as is")
        ] = None,
        *,
        attachments: Attachments = None,
        schema: Schema = None,
        retract: Annotated[
            bool,
            Field(description="first withdraw the last turn (failed or cancelled) for good"),
        ] = False,
        model: Annotated[
            str | None, Field(description="from this message on, this model (conversation_models)")
        ] = None,
    ) -> str:
        """Answer a need (kind "need" in `waiting`), or send a message when nothing waits;
        a need answered by another first: nothing is sent. Approvals are the person's."""
        if schema is not None and need:
            raise InputRejected("a schema goes with a message, not with a need's answer")
        text = _with_schema(response, schema, settings.max_schema_bytes) or response
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            changed: dict[str, Any] = {}
            if retract:
                changed["retracted"] = actions.retract(settings, conv)["retracted"]
            if model is not None:
                changed["model"] = actions.set_model(settings, conv, model)["model"]
            meta = read_metadata(conv)
            files = faces.attached(attachments or (), meta.template if meta else None)
            done = actions.respond(
                settings,
                faces.reader,
                conv,
                text,
                need,
                face="mcp",
                plain=plain or schema is not None,
                since=cursor,
                files=files,
            )
        return _json({"conversation_id": conv.id} | changed | done)

    return conversation_respond


def _conversation_approve(faces: Faces, settings: Settings) -> Callable[..., Any]:
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
        ctx: Context[Any, Any] | None = None,
    ) -> str:
        """Allow (once or always) or reject a lookup waiting for approval (kind "approval" in
        `waiting`), if the person lets you: a client that shows forms asks the person
        instead (conversation_wait puts the form)."""
        forms = ctx is not None and shows_forms(ctx)
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            actions.agent_may_approve(settings, conv, forms=forms)
            done = actions.approve(settings, conv, decision, need, reader=faces.reader, face="mcp")
        return _json({"conversation_id": conv.id} | done)

    return conversation_approve


def _conversation_list(faces: Faces, settings: Settings) -> Callable[..., Any]:
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

    return conversation_list


def _conversation_cancel(faces: Faces, settings: Settings) -> Callable[..., Any]:
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

    return conversation_cancel


def _conversation_continue(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_continue(conversation_id: Id) -> str:
        """Have the model go on with its last reply where it stopped (`reply_cut`: a token
        limit, a loop): its words come in a new block, no message in your name. Returns a
        cursor for conversation_wait."""
        with faces.lock:
            conv = faces.reader.locate(conversation_id)
            done = actions.go_on(settings, conv, face="mcp")
            cursor = faces.reader.boundary(conv)
        return _json({"conversation_id": conv.id} | done | {"cursor": cursor})

    return conversation_continue


def _conversation_models(faces: Faces, settings: Settings) -> Callable[..., Any]:
    async def conversation_models() -> str:
        """What conversation_start can name: each backend's models (or why it cannot be
        reached), the defaults, and the templates."""
        return _json(await faces.models())

    return conversation_models


def _conversation_wait(faces: Faces, settings: Settings) -> Callable[..., Any]:
    async def conversation_wait(  # noqa: PLR0917 - the SDK passes a tool's arguments by name
        conversation_id: Id,
        cursor: Cursor = None,
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

        async def wait(seconds: float) -> dict[str, Any]:
            return await faces.wait(
                conversation_id,
                cursor,
                seconds,
                include_own=include_own,
                progress=progress,
                max_bytes=max_bytes,
            )

        try:
            if ctx is None or declared(ctx.request_context.meta) or not takes_forms(ctx):
                return _json(await wait(timeout_s))
            # a lookup marked ask is the person's: a form through the client, then on
            return _json(await wait_asking(faces, ctx, wait, min(timeout_s, faces.limits.wait_cap)))
        except ContemplationError as exc:
            raise ToolError(str(exc)) from exc

    return conversation_wait


def _conversation_search(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_search(  # noqa: PLR0917 - the SDK passes the arguments by name
        query: Annotated[
            str,
            Field(
                description='words, "a phrase", a OR b, a NOT b, prefix* (3 letters or more); '
                "at most 1 KB"
            ),
        ],
        archived: Annotated[bool, Field(description="search archived conversations too")] = False,
        model: Annotated[str, Field(description='only this model ("name" or "backend/name")')] = "",
        status: Annotated[
            str, Field(description='only conversations in this status ("archived" too)')
        ] = "",
        since: Annotated[
            str, Field(description="only blocks from this day on: YYYY-MM-DD[ HH:MM]")
        ] = "",
        limit: Annotated[int, Field(ge=1, le=50, description="hits at most")] = 10,
        mode: Annotated[
            Literal["", "words", "meaning", "both"],
            Field(description='rank by words, meaning or both ("": both when installed)'),
        ] = "",
        cursor: Annotated[str, Field(description="the next page: a result's 'next'")] = "",
    ) -> str:
        """Search every conversation by words and by meaning; best first, each hit a block
        with a «snippet» and its relevance (close/near/far). nothing_close: only the nearest;
        note: ranked by words only; next: a cursor."""
        from contemplation.index import embedder, fusion
        from contemplation.index.search import Filters, since_bound

        embedder.configure(*settings.semantic.server())  # [semantic]: the person's server

        filters = Filters(
            archived=archived,
            model=model,
            status=status.strip().lower(),
            since=since_bound(since),
        )
        page = fusion.search(
            faces.home, query, filters, limit, mode=mode, cursor=cursor or None,
            seconds=settings.search_seconds,
        )
        return _json(page.as_dict())

    return conversation_search


def _conversation_related(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_related(
        conversation_id: Id,
        limit: Annotated[int, Field(ge=1, le=50, description="conversations at most")] = 10,
        cursor: Annotated[str, Field(description="the next page: a result's 'next'")] = "",
    ) -> str:
        """The conversations nearest in meaning to this one, nearest first (needs the
        semantic extra), each with its "relevance" (close, near or far); "next" pages on."""
        from contemplation.index import embedder, fusion

        embedder.configure(*settings.semantic.server())  # [semantic]: the person's server

        conv = faces.reader.locate(conversation_id)
        return _json(fusion.related(faces.home, conv.id, limit, cursor=cursor or None).as_dict())

    return conversation_related


def _conversation_reopen(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_reopen(conversation_id: Id) -> str:
        """Bring an archived conversation back to continue it (conversation_respond next)."""
        with faces.lock:
            conv = actions.reopen(faces.home, faces.reader.locate(conversation_id))
        return _json({"conversation_id": conv.id, "archived": False, "path": str(conv.dir)})

    return conversation_reopen


def _conversation_fork(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_fork(
        conversation_id: Id,
        at: Annotated[
            int | None,
            Field(ge=1, description="the last block the fork takes, from 1 (default: all)"),
        ] = None,
        topic: Annotated[str | None, Field(description="the fork's topic")] = None,
        rerun: Annotated[
            bool,
            Field(description="if block `at` is yours, the model answers it now (default: no)"),
        ] = False,
        seat: Annotated[
            str | None, Field(description="a panel: follow this seat's line alone (its label)")
        ] = None,
    ) -> str:
        """A new conversation holding blocks 1..at of this one (archived ones too); your next
        message to it continues from there (no turn runs before it unless rerun)."""
        from contemplation.faces import fork, reading

        src = faces.reader.locate(conversation_id)
        done = fork.fork(
            faces.home,
            src,
            at=at,
            topic=topic,
            durable=settings.durability == "fsync",
            rerun=rerun,
            seat=seat,
        )
        out = {"conversation_id": done.conv.id} | done.as_dict()
        out["cursor"] = sum(s.size for s in reading.segments(done.conv))  # the log's end
        return _json(out)

    return conversation_fork


def _conversation_archive(faces: Faces, settings: Settings) -> Callable[..., Any]:
    @_errors_as_tool_errors
    def conversation_archive(conversation_id: Id) -> str:
        """Move a finished conversation to completed/ (its files are kept)."""
        conv = faces.reader.locate(conversation_id)
        dest = actions.archive_conversation(faces.home, conv)
        return _json({"conversation_id": dest.id, "archived": True, "path": str(dest.dir)})

    return conversation_archive


_TOOLS: tuple[_Tool, ...] = (
    _Tool(_conversation_start, ToolAnnotations(idempotent_hint=True, open_world_hint=False)),
    _Tool(_conversation_check, _READ_ONLY, _PAGING),
    _Tool(_conversation_respond, ToolAnnotations(open_world_hint=False), _PAGING),
    _Tool(_conversation_approve, ToolAnnotations(open_world_hint=False)),
    _Tool(_conversation_list, _READ_ONLY),
    _Tool(_conversation_cancel, _UNDOABLE),
    _Tool(_conversation_continue, _UNDOABLE),
    _Tool(_conversation_models, _READ_ONLY),
    _Tool(_conversation_wait, _READ_ONLY, _PAGING),
    _Tool(_conversation_search, _READ_ONLY),
    _Tool(_conversation_related, _READ_ONLY),
    _Tool(_conversation_reopen, _UNDOABLE),
    _Tool(_conversation_fork, _UNDOABLE),
    _Tool(_conversation_archive, _UNDOABLE),
)


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
        "last error, whether a daemon runs, turns finished and the log's end (cursor)",
        mime_type="application/json",
    )
    def conversation_status(conversation_id: str) -> str:
        try:
            return faces.status_text(faces.reader.locate(conversation_id))
        except ContemplationError as exc:
            raise ResourceError(str(exc)) from exc


def token_path(home: Home) -> Path:
    """The MCP HTTP face's token: every request needs it (0600, made at its first start)."""
    return home.root / TOKEN_FILE


def url_of(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"


def print_claude_command(settings: Settings, http_port: int, host: str = "127.0.0.1") -> None:
    """``contemplation mcp --http PORT --print-claude-command``: the line that adds this face
    to Claude Code, which reads the token through a helper, never from the line
    (:mod:`contemplation.faces.mcp.connect`)."""
    home = Home(settings.home)
    ensure_home(home)
    bearer.ensure_token(token_path(home))
    print(connect.claude_line(url_of(host, http_port), settings))


async def serve_stdio(server: ContemplationServer, stdin: Any = None, stdout: Any = None) -> None:
    """The SDK's stdio serving, with each line it cannot read answered by a JSON-RPC error
    (:mod:`contemplation.faces.mcp.wire`; the SDK drops it, and the request waits forever).
    ``stdin`` / ``stdout``: the lines in and out where the process's own are not the wire
    (:mod:`contemplation.faces.mcp.front` holds them)."""
    from mcp.server.stdio import stdio_server

    from contemplation.faces.mcp.wire import Answering

    low = server._lowlevel_server  # run_stdio_async's own two lines, plus Answering
    async with stdio_server(stdin, stdout) as (read_stream, write_stream):
        await low.run(
            Answering(read_stream, write_stream),
            write_stream,
            low.create_initialization_options(),
        )


def run_http(settings: Settings, http_port: int, host: str = "127.0.0.1") -> None:
    """The streamable HTTP face (stdio is served by :mod:`contemplation.faces.mcp.front`)."""
    server = build_server(settings)
    import socket

    import uvicorn

    home = Home(settings.home)
    ensure_home(home)
    path = token_path(home)
    token = bearer.ensure_token(path)  # before the port opens: no request comes before it
    try:  # bound before the address is announced: a busy port is one line and exit 1
        sock = socket.create_server((host, http_port))
    except OSError as exc:
        raise ContemplationError(
            f"cannot serve MCP on {host}:{http_port}: {exc.strerror or exc}"
        ) from exc
    hint = f"send Authorization: Bearer <the token in {path}>"
    app = bearer.RequireBearer(
        server.streamable_http_app(host=host), token=lambda: token, hint=hint
    )
    config = uvicorn.Config(
        app, host=host, port=http_port, log_config=None, access_log=False, log_level="warning"
    )
    url = url_of(host, http_port)
    # the token itself stays out of the log: the line reads it from its file when pasted
    said = f"MCP streamable HTTP on {url} (every request needs the token in {path})"
    print(said, file=sys.stderr)
    told = connect.claude_line(url, settings)
    print(f"add it to Claude Code: {told}", file=sys.stderr, flush=True)
    uvicorn.Server(config).run(sockets=[sock])
