"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, protocol 2026-07-28) on the
durable queue: the agent is told when the model has answered, it never polls.

To a client that declares the extension *on its request* (``_meta`` →
``io.modelcontextprotocol/clientCapabilities`` → ``extensions``), a tool that starts a model
turn (:data:`TASK_TOOLS`) runs as always (the message is durable in ``inbox/`` when it
returns) and is then answered with a ``CreateTaskResult`` (``resultType: "task"``) once the
task's record is durable in the conversation's ``tasks/`` folder
(:mod:`contemplation.writer.tasks`). Any other client gets the tool's own result, unchanged.

A task id is ``<conversation id>.<32 hex digits>``: 128 random bits
(:func:`secrets.token_hex`) name the record, the conversation id finds the folder, so any MCP
server process on the same home answers for it, after a crash or a restart of either side.

``tasks/get`` reads the conversation every time (nothing is kept in memory): the task is
``working`` while the turn runs, with the activity line every face shows as its
``statusMessage``; ``completed`` once the conversation is settled, with what
``conversation_wait`` returns then (the model's blocks since the message, a draft a crash
cut and the model redid left out (:func:`.task_turn.without_redone`), cut to the page
budget with a cursor, ``parsed`` for a structured reply, ``waiting`` with the call that
settles each need or lookup); a failed turn completes with ``isError``; ``cancelled`` after
``tasks/cancel`` once the turn has stopped (waiting for its slot, loading or streaming), or at
once when its message was still queued (it is withdrawn from ``inbox/`` before a daemon's
claim links it into ``processing/``, and never reaches the model). Each task is its own
question: its result is its message's turn only (:mod:`.task_turn`), never a later
message's reply.
``ttlMs`` is the retention of archived conversations (``[retention] archived_days``; null:
kept until the conversation is deleted).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, RequestParams
from mcp_types.jsonrpc import INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import Field

from contemplation.base import acting
from contemplation.errors import AlreadyDecided, ContemplationError
from contemplation.faces import actions
from contemplation.faces.actions import INITIAL_NAME
from contemplation.faces.mcp import task_turn
from contemplation.faces.mcp.calls import Faces
from contemplation.faces.mcp.elicit import CAPABILITIES_KEY, approval_form, elicits
from contemplation.models import CANCELLABLE, State, Status
from contemplation.store import activity
from contemplation.store.layout import Conv, read_state
from contemplation.writer import daemon_alive
from contemplation.writer.files import atomic_write_json
from contemplation.writer.folders import withdraw
from contemplation.writer.tasks import read_task, task_path, write_task

EXTENSION = "io.modelcontextprotocol/tasks"
#: the tools that start a model turn: answered with a task to a client that takes tasks
TASK_TOOLS = frozenset({"conversation_start", "conversation_respond", "conversation_approve"})
SECRET_HEX = 32  # 128 bits
MAX_RESPONSES = 64  # inputResponses read from one tasks/update
#: pollIntervalMs by what is happening: tokens streaming, the model at work, queued, stalled
POLL_STREAMING = 1000
POLL_WORKING = 2000
POLL_QUEUED = 5000
POLL_STALLED = 15000
_AT_WORK = frozenset({Status.GENERATING, Status.ROUTING, Status.RETRYING})


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict)


def declared(meta: Any) -> bool:
    """Whether the request's ``_meta`` declares the tasks extension."""
    caps = meta.get(CAPABILITIES_KEY) if isinstance(meta, dict) else None
    exts = caps.get("extensions") if isinstance(caps, dict) else None
    return isinstance(exts, dict) and EXTENSION in exts


def missing_extension() -> MCPError:
    """The error a client that did not declare the extension gets for a task method."""
    return MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        "Missing required client capability",
        {"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _not_found(task_id: str) -> MCPError:
    return MCPError(INVALID_PARAMS, f"Failed to retrieve task: Task not found ({task_id[:160]})")


class Tasks:
    """Create, read and cancel tasks over the conversations' folders (no SDK in the bodies
    but the errors: plain functions to test)."""

    def __init__(self, faces: Faces) -> None:
        self.faces = faces

    @property
    def ttl_ms(self) -> int | None:
        days = self.faces.settings.retention.archived_days
        return None if days is None else days * 86_400_000

    def create(
        self,
        conv_id: str,
        since: int,
        tool: str,
        queued: str | None = None,
        text: str | None = None,
    ) -> dict[str, Any]:
        """Write the record of a new task on ``conv_id`` whose reply is what follows cursor
        ``since`` (``queued``: the inbox name of its message, withdrawn by a cancel that
        comes before a daemon claims it; ``text``: the message, known again in the log by
        its fingerprint, see :mod:`.task_turn`); returns the task as ``tasks/get`` shows it
        (durable on return)."""
        conv = self.faces.reader.locate(conv_id)
        secret = secrets.token_hex(SECRET_HEX // 2)
        now = datetime.now(UTC).timestamp()
        # the seed: the message was just queued (what runs ahead of it is tasks/get's to say:
        # counting it reads every conversation's summary, most of this call's time at 500)
        alive = daemon_alive(self.faces.home)
        said = "queued" if alive else activity.describe(None, model="", daemon=False, queued=1)
        record: dict[str, Any] = {
            "conversation_id": conv.id,
            "since": since,
            "tool": tool,
            "created": now,
            "said": said,  # what this answer says: a tasks/get that says otherwise is an update
            # the MCP server that answers it: once it is gone, nothing may tell the client
            # (the agent's watch then says the reply itself)
            "server": acting.this_process(),
        }
        if queued:
            record["queued"] = queued
        if text and text.strip():
            record |= task_turn.fingerprint(text)
        durable = self.faces.settings.durability == "fsync"
        write_task(conv, secret, record, durable=durable)
        stamp = _iso(now)
        return {
            "taskId": f"{conv.id}.{secret}",
            "createdAt": stamp,
            "lastUpdatedAt": stamp,
            "ttlMs": self.ttl_ms,
            "status": "working",
            "statusMessage": said,
            "pollIntervalMs": POLL_QUEUED if alive else POLL_STALLED,
        }

    def locate(self, task_id: str) -> tuple[Conv, str, dict[str, Any]]:
        conv_id, _, secret = task_id.rpartition(".")
        if (
            not conv_id
            or len(secret) != SECRET_HEX
            or not all(c in "0123456789abcdef" for c in secret)
        ):
            raise _not_found(task_id)
        try:
            conv = self.faces.reader.locate(conv_id)
        except ContemplationError:
            raise _not_found(task_id) from None
        record = read_task(conv, secret)
        if record is None or record.get("conversation_id") != conv.id:
            raise _not_found(task_id)
        return conv, secret, record

    def get(self, task_id: str, *, elicit: bool = False) -> dict[str, Any]:
        """The task as the conversation says it is now (a ``DetailedTask``). ``elicit``: the
        client takes elicitation forms, so lookups that wait for approval are asked of the
        person as ``input_required`` (answered with ``tasks/update``)."""
        conv, secret, record = self.locate(task_id)
        created = float(record.get("created") or 0.0)
        state = read_state(conv)
        try:  # what the status and its message come from, besides the clock and the daemon
            written = conv.state.stat().st_mtime if state is not None else created
        except OSError:  # archived meanwhile
            written = created
        shown = self._now(conv, secret, record, state, elicit=elicit)
        changed = max(created, written, float(record.get("cancelled_at") or 0.0))
        told = self._told(conv, secret, record, shown, changed, elicit=elicit)
        return {
            "taskId": task_id,
            "createdAt": _iso(created),
            "lastUpdatedAt": _iso(told),
            "ttlMs": self.ttl_ms,
        } | shown

    def _told(
        self,
        conv: Conv,
        secret: str,
        record: dict[str, Any],
        shown: dict[str, Any],
        changed: float,
        *,
        elicit: bool,
    ) -> float:
        """``lastUpdatedAt`` (epoch seconds): when the status or ``statusMessage`` last changed.
        The message follows the clock too ("generating for 12 s", a retry's countdown) and
        the daemon's life, which no file's time tells, so what a ``tasks/get`` said is kept
        beside the task's record (``<secret>.told``, one per kind of client: one that takes
        forms is told ``input_required`` where another is told ``completed``); a look that
        says otherwise is an update, at the time of the files it came from when they moved
        since (``changed``), else now. The same words keep their time; every change moves it
        on by a millisecond at least. Nothing is kept in memory: any MCP process says the same."""
        key = "forms" if elicit else "plain"
        path = _told_path(conv, secret)
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept = {}
        kept = kept if isinstance(kept, dict) else {}
        said = [shown["status"], shown.get("statusMessage")]
        prev = kept.get(key)
        if not (isinstance(prev, list) and len(prev) == 3 and isinstance(prev[2], int)):
            prev = None  # not looked at yet: what conversation_start's answer said, if known
            if "said" in record:
                prev = ["working", record["said"], int(float(record.get("created") or 0) * 1000)]
        if prev is not None and prev[:2] == said:
            return int(prev[2]) / 1000
        changed_ms = int(changed * 1000)
        if prev is None or changed_ms > prev[2]:
            at = changed_ms
        else:
            at = max(int(datetime.now(UTC).timestamp() * 1000), prev[2] + 1)
        kept[key] = [*said, at]
        with contextlib.suppress(OSError):  # archived meanwhile: said again next time
            atomic_write_json(path, kept, durable=False)
        return at / 1000

    def portion(self, conv: Conv, secret: str, record: dict[str, Any]) -> task_turn.Portion:
        """The task's part of the log (:func:`task_turn.locate`); what it found is kept in
        the record, so the next look starts there."""
        known = (record.get("at"), record.get("end"))
        with self.faces.lock:
            got = task_turn.locate(conv, secret, record)
        if (record.get("at"), record.get("end")) != known:
            with contextlib.suppress(OSError):  # archived meanwhile: found again next time
                write_task(conv, secret, record, durable=False)
        return got

    def _now(
        self,
        conv: Conv,
        secret: str,
        record: dict[str, Any],
        state: State | None,
        *,
        elicit: bool,
    ) -> dict[str, Any]:
        """The task's status, its message and what goes with them, as the conversation is now."""
        if record.get("withdrawn"):
            return {
                "status": "cancelled",
                "statusMessage": "cancelled: the message was withdrawn before the model saw it",
            }
        part = self.portion(conv, secret, record)
        since = part.start
        # a later question's message began: this task's turn is over, whatever runs now
        settled = part.end is not None or self.faces.settled(conv)
        if record.get("cancelled_at") and (
            settled or state is None or state.status not in _AT_WORK
        ):
            return {
                "status": "cancelled",
                "statusMessage": "cancelled: the turn was stopped",
            }
        if not settled:
            out = self.faces.check(conv.id, since)
            return {
                "status": "working",
                "statusMessage": str(out.get("activity") or out.get("status")),
                "pollIntervalMs": self._poll(out),
            }
        out = self.faces.check(conv.id, since)
        if part.end is not None:
            out = task_turn.trimmed(out, part.end)
        out = task_turn.without_redone(out)
        asks = [i for i in out.get("waiting", []) if i.get("kind") == "approval"]
        if elicit and asks:
            return {
                "status": "input_required",
                "statusMessage": str(out.get("activity") or ""),
                "pollIntervalMs": POLL_QUEUED,
                "inputRequests": {
                    str(i["id"]): approval_form(i, str(out.get("model", ""))) for i in asks
                },
            }
        out["timed_out"] = False
        result = {
            "content": [
                {"type": "text", "text": json.dumps(out, ensure_ascii=False, separators=(",", ":"))}
            ],
            "isError": part.end is None and out.get("status") == Status.ERROR.value,
        }
        return {
            "status": "completed",
            "statusMessage": str(out.get("activity") or ""),
            "result": result,
        }

    def _poll(self, out: dict[str, Any]) -> int:
        if not daemon_alive(self.faces.home):
            return POLL_STALLED
        status = out.get("status")
        if status == Status.GENERATING.value and out.get("in_progress"):
            return POLL_STREAMING
        if status in {s.value for s in _AT_WORK}:
            return POLL_WORKING
        return POLL_QUEUED

    def cancel(self, task_id: str) -> None:
        """Stop the task's turn wherever it is: a message still queued is withdrawn from
        ``inbox/`` (:func:`~contemplation.writer.folders.withdraw`) unless the daemon's
        claim has already linked it into ``processing/`` (the claim's first half, before
        its request; the claim has won then, and the withdraw makes it durable); a turn
        claimed and waiting for a slot, loading or streaming is cancelled by the daemon
        (:func:`actions.cancel`), and the task ends ``cancelled``. A task whose turn is over
        (answered, or a later message's turn has begun) or that waits for the person is not
        cancelled: a JSON-RPC error says why, never a silent success."""
        conv, secret, record = self.locate(task_id)
        if record.get("cancelled_at"):
            return  # asked again: as the first time
        if conv.is_completed:
            raise _cannot(task_id, "its conversation is archived (the turn is over)")
        durable = self.faces.settings.durability == "fsync"
        queued = record.get("queued")
        if isinstance(queued, str) and withdraw(conv, queued, durable=durable):
            record["cancelled_at"] = datetime.now(UTC).timestamp()
            record["withdrawn"] = True
            write_task(conv, secret, record, durable=durable)
            return
        part = self.portion(conv, secret, record)
        if part.end is not None:
            raise _cannot(task_id, "it has completed (a later message's turn has begun)")
        state = read_state(conv)
        if state is not None and state.status is Status.AWAITING_APPROVAL:
            raise _cannot(task_id, _persons(conv))
        over = f"its turn is over (the conversation is {state.status.value if state else 'new'})"
        idle = state is None or state.status not in CANCELLABLE
        if part.found and idle and not actions.log_awaits_turn(conv):
            # its message is in the log and answered, and no turn runs: a turn now due is a
            # later message's (claimed, not yet in the log), never this task's to cancel
            raise _cannot(task_id, over)
        with self.faces.lock:
            stopping = actions.cancel(conv)
        if stopping is None:
            raise _cannot(task_id, over)
        record["cancelled_at"] = datetime.now(UTC).timestamp()
        write_task(conv, secret, record, durable=durable)

    def update(self, task_id: str, responses: dict[str, Any]) -> None:
        """The person's answers to the forms (``inputResponses``): accept with a decision,
        or decline (a rejection); a cancelled form or an unknown key is ignored. An answer
        about a lookup decided already (the first decision is final) is a JSON-RPC error
        naming that decision, who made it and when: never a silent success."""
        conv, _, _ = self.locate(task_id)
        refused: list[str] = []
        for key, response in list(responses.items())[:MAX_RESPONSES]:
            if not isinstance(response, dict):
                continue
            action = response.get("action")
            content = response.get("content")
            decision = content.get("decision") if isinstance(content, dict) else None
            if action == "decline":
                decision = "reject"
            elif action != "accept" or decision not in actions.DECISIONS:
                continue
            try:
                actions.approve(
                    self.faces.settings,
                    conv,
                    str(decision),
                    str(key),
                    reader=self.faces.reader,
                    face="form",
                )
            except AlreadyDecided as exc:  # the person is told: their answer did nothing
                refused.append(str(exc))
            except ContemplationError:
                continue  # not outstanding (answered, or never asked): ignored
        if refused:
            raise MCPError(INVALID_PARAMS, "; ".join(refused))


def _cannot(task_id: str, why: str) -> MCPError:
    return MCPError(INVALID_PARAMS, f"Cannot cancel task {task_id[:160]}: {why}")


def _persons(conv: Conv) -> str:
    """Why a turn paused on a lookup is not cancelled: that decision is the person's, and
    where they take it (a reject ends the wait; the model then goes on without the lookup)."""
    return (
        "its turn waits for the person's decision on a lookup (awaiting_approval), which the "
        "agent does not take: the person rejects it in the form, on the dashboard, or in their "
        f"own terminal ({conv.id})"
    )


def _told_path(conv: Conv, secret: str) -> Path:
    """Where what ``tasks/get`` last said of a task is kept (beside its record)."""
    return task_path(conv, secret).with_suffix(".told")


def _since_before(faces: Faces, params: CallToolRequestParams) -> int | None:
    """Where the reply to an answer or a decision will start: the log's end before the call
    (the agent's own blocks are left out of the result, so its message may come after)."""
    cid = (params.arguments or {}).get("conversation_id")
    if not isinstance(cid, str):
        return None
    try:
        return faces.reader.boundary(faces.reader.locate(cid))
    except (ContemplationError, OSError):
        return None


class TasksExtension(Extension):
    """The SDK's extension: the ``tools/call`` interceptor and ``tasks/get`` /
    ``tasks/cancel``."""

    identifier = EXTENSION

    def __init__(self, faces: Faces) -> None:
        self.tasks = Tasks(faces)
        self.faces = faces

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
            MethodBinding("tasks/update", UpdateParams, self._update),
        )

    @staticmethod
    def _require(ctx: ServerRequestContext[Any, Any]) -> None:
        if not declared(ctx.meta):
            raise missing_extension()

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        self._require(ctx)
        elicit = elicits(ctx.meta)
        task = await anyio.to_thread.run_sync(
            lambda: self.tasks.get(str(params.task_id), elicit=elicit)
        )
        return task | {"resultType": "complete"}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        self._require(ctx)
        responses = dict(params.input_responses)
        await anyio.to_thread.run_sync(self.tasks.update, str(params.task_id), responses)
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        self._require(ctx)
        await anyio.to_thread.run_sync(self.tasks.cancel, str(params.task_id))
        return {"resultType": "complete"}

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS or not declared(ctx.meta):
            return await call_next(ctx)
        before = await anyio.to_thread.run_sync(_since_before, self.faces, params)
        result = await call_next(ctx)
        if not isinstance(result, CallToolResult) or result.is_error:
            return result
        try:
            said = json.loads("".join(getattr(b, "text", "") for b in result.content))
        except ValueError:
            return result
        cid = said.get("conversation_id") if isinstance(said, dict) else None
        prompt = (params.arguments or {}).get("initial_prompt")
        empty = params.name == "conversation_start" and not (
            isinstance(prompt, str) and prompt.strip()
        )
        if not isinstance(cid, str) or empty:
            return result  # no message: no turn to wait for
        since = int(said.get("cursor") or 0) if params.name == "conversation_start" else before
        queued = INITIAL_NAME if params.name == "conversation_start" else said.get("queued")
        sent = (params.arguments or {}).get(
            "initial_prompt" if params.name == "conversation_start" else "response"
        )
        task = await anyio.to_thread.run_sync(
            self.tasks.create,
            cid,
            since if since is not None else 0,
            params.name,
            queued if isinstance(queued, str) else None,
            sent if isinstance(sent, str) and params.name != "conversation_approve" else None,
        )
        return task | {"resultType": "task"}
