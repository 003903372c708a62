"""Push for tasks (``io.modelcontextprotocol/tasks``): a ``subscriptions/listen`` request that
names task ids gets ``notifications/tasks`` with the whole task, as ``tasks/get`` would return
it, every time its status or ``statusMessage`` changes, so a client that listens need not
poll. The conversation lives in another process, so each followed task is looked at every
:data:`LOOK_EVERY` seconds (a few ``stat`` calls; the task is read only when one of its files
moved, or at least every ``RECOMPUTE_EVERY`` seconds). A task that reached a terminal status
is told once and no longer followed; the stream ends when no task is left and it holds no
resource subscription.

Bounded like the resource subscriptions: task ids per stream and per session
(``Limits.max_subscriptions``), open streams (``Limits.max_listen_streams``), and each
stream's backlog of resource events. A session that ends cancels its streams, and with them
what they followed."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Literal, cast

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ServerEvent,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from pydantic import BaseModel

from contemplation.errors import ContemplationError
from contemplation.faces.mcp.elicit import elicits
from contemplation.faces.mcp.subscriptions import (
    LISTEN_BACKLOG,
    RECOMPUTE_EVERY,
    connection_of,
    stat_key,
)
from contemplation.faces.mcp.tasks import Tasks, declared, missing_extension
from contemplation.store.layout import Conv
from contemplation.writer import daemon_alive
from contemplation.writer.tasks import task_path

LOOK_EVERY = 0.25  # seconds between two looks at the followed tasks
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class TaskNotification(BaseModel):
    """``notifications/tasks`` (the SDK's types do not know the extension's notification)."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


@dataclass(eq=False)
class _Followed:
    task_id: str
    conv: Conv
    gate: tuple[Any, ...] = ()
    said: tuple[Any, ...] = ()  # what was last told: status and statusMessage
    done: bool = False


class TaskPush:
    """Serves the listen streams that name task ids (see the module doc)."""

    def __init__(self, tasks: Tasks, bus: SubscriptionBus) -> None:
        self.tasks = tasks
        self.bus = bus
        self.streams = 0
        self.per_session: dict[int, int] = {}  # session (its connection) → task ids followed

    def _follow(self, task_ids: list[str]) -> list[_Followed]:
        out = []
        for task_id in task_ids:
            try:
                conv, _, _ = self.tasks.locate(task_id)
            except MCPError:
                continue  # not a task: left out of the ack
            out.append(_Followed(task_id, conv))
        return out

    def _look(self, f: _Followed, elicit: bool) -> dict[str, Any] | None:
        """The task when it changed since it was last told, else None (in a worker thread)."""
        try:
            if not f.conv.dir.is_dir():  # archived since the last look
                f.conv = self.tasks.faces.reader.locate(f.conv.id)
            conv, secret = f.conv, f.task_id.rpartition(".")[2]
            files = (conv.state, conv.metadata, conv.inbox, conv.processing, conv.log)
            slot = int(time.monotonic() // RECOMPUTE_EVERY)
            alive = daemon_alive(self.tasks.faces.home)
            gate = (str(conv.dir), alive, slot, *map(stat_key, (*files, task_path(conv, secret))))
            if gate == f.gate:
                return None
            f.gate = gate
            task = self.tasks.get(f.task_id, elicit=elicit)
        except (ContemplationError, MCPError, OSError):
            return None  # gone, or not readable now: nothing to tell
        said = (task["status"], task.get("statusMessage"))
        if said == f.said:
            return None
        f.said, f.done = said, task["status"] in TERMINAL
        return task

    async def listen(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: SubscriptionsListenRequestParams,
        task_ids: list[str],
    ) -> SubscriptionsListenResult:
        """One listen stream: the ack, then the followed tasks' changes and the resource
        events the request asked for, until nothing is left to follow or the client goes."""
        if not declared(ctx.meta):
            raise missing_extension()
        sid = ctx.request_id
        if sid is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        limits = self.tasks.faces.limits
        if len(task_ids) > (most := limits.max_subscriptions):
            raise MCPError(INVALID_PARAMS, f"at most {most} task ids per listen stream")
        key = id(connection_of(ctx))
        if self.per_session.get(key, 0) + len(task_ids) > most:
            raise MCPError(INVALID_REQUEST, f"at most {most} task ids followed per session")
        if self.streams >= limits.max_listen_streams:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        followed = await anyio.to_thread.run_sync(self._follow, task_ids)
        self.streams += 1
        self.per_session[key] = self.per_session.get(key, 0) + len(followed)
        try:
            return await self._serve(ctx, params, sid, followed)
        finally:
            self.streams -= 1
            self.per_session[key] -= len(followed)
            if self.per_session[key] <= 0:
                del self.per_session[key]

    async def _serve(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: SubscriptionsListenRequestParams,
        sid: Any,
        followed: list[_Followed],
    ) -> SubscriptionsListenResult:
        asked = params.notifications
        uris = list(asked.resource_subscriptions or ())
        honored = SubscriptionFilter.model_validate(
            {
                "toolsListChanged": asked.tools_list_changed or None,
                "promptsListChanged": asked.prompts_list_changed or None,
                "resourcesListChanged": asked.resources_list_changed or None,
                "resourceSubscriptions": uris or None,
                "taskIds": [f.task_id for f in followed],
            }
        )
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: sid}
        elicit = elicits(ctx.meta)
        lasting = bool(uris) or any(
            (asked.tools_list_changed, asked.prompts_list_changed, asked.resources_list_changed)
        )
        send, recv = anyio.create_memory_object_stream[ServerEvent](LISTEN_BACKLOG)

        def deliver(event: ServerEvent) -> None:
            if event_matches(honored, frozenset(uris), event):
                # a client that stopped reading misses resource events, never tasks
                with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                    send.send_nowait(event)

        unsubscribe = self.bus.subscribe(deliver)
        try:
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=honored, _meta=meta
                    )
                ),
                related_request_id=sid,
            )
            async with anyio.create_task_group() as tg:

                async def events() -> None:
                    async for event in recv:
                        note = event_to_notification(event, meta)
                        await ctx.session.send_notification(note, related_request_id=sid)

                tg.start_soon(events)
                while lasting or not all(f.done for f in followed):
                    for f in [f for f in followed if not f.done]:
                        task = await anyio.to_thread.run_sync(self._look, f, elicit)
                        if task is not None:
                            note = TaskNotification(params=task | {"_meta": meta})
                            await ctx.session.send_notification(
                                cast(Any, note), related_request_id=sid
                            )
                    await anyio.sleep(LOOK_EVERY)
                tg.cancel_scope.cancel()
        finally:
            unsubscribe()
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=meta)
