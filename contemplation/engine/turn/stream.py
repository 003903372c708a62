"""The turn's reply, streamed into the log: the request sent (compacted once more when the
server refuses it for its window), the reasoning budget guard, the agent's cancel and a
deleted folder checked as the events come. Making the events durable is the writer's
(:meth:`contemplation.writer.reply.Feed.drain`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from contemplation.backends.base import Backend
from contemplation.engine.turn.ahead import opened
from contemplation.engine.turn.fit import backend, capped, refused
from contemplation.engine.turn.state import Attempt, Gone
from contemplation.errors import ContextOverflow
from contemplation.models import ChatRequest, StreamEvent
from contemplation.prompt import budget
from contemplation.protocol.repetition import ReplyWatch
from contemplation.writer import Streamed

log = structlog.get_logger("contemplation.turn")

CANCEL_CHECK_INTERVAL = 0.2


async def refitted(
    at: Attempt, planned: budget.Plan, request: ChatRequest
) -> tuple[Streamed, budget.Plan, ChatRequest]:
    """:func:`guarded`; a prompt the server refuses for its window, saying how many tokens it
    counted, is compacted once and sent again (:func:`~.fit.refused`)."""
    share = at.rt.settings.reply_cap
    request = capped(request, planned.window, share)
    try:
        return await guarded(at, request), planned, request
    except ContextOverflow as exc:
        if at.reply.started or not exc.n_prompt:
            raise
        planned, request = await refused(at, exc, request)
        request = capped(request, planned.window, share)
        return await guarded(at, request), planned, request


async def guarded(at: Attempt, request: ChatRequest) -> Streamed:
    """:func:`pump`, and the reasoning budget guard: a reply that spent all its tokens
    (num_predict / max_tokens) thinking and wrote no answer gets one continuation with
    thinking off, in the same block, after a NOTE that says so."""
    reply, on = at.reply, at.on
    made = backend(on)
    watch = watching(request) if at.rt.settings.stop_repeating else None
    got = await pump(at, made, request, on_end=at.held.release, watch=watch)
    usage = got.usage
    if (
        usage is None
        or usage.done_reason != "length"
        or request.think is False
        or not reply.started  # nothing at all was written: not a thinking reply
        or got.calls
        or reply.text.strip()
    ):
        return got
    spent = f"all {usage.eval_count} tokens" if usage.eval_count else "all its tokens"
    await reply.note(
        f"the model spent {spent} of this reply thinking and wrote no answer; "
        "asked once more with thinking off"
    )
    log.info("thinking_budget_spent", conv=at.conv.id, tokens=usage.eval_count)
    async with on.host.scheduler.slot(on.model) as again_held:  # let go at the end
        again = await pump(
            at, made, replace(request, think=False), on_end=again_held.release, watch=watch
        )
    again.truncated = again.truncated or got.truncated
    return again


def watching(request: ChatRequest) -> ReplyWatch:
    """The loop watch for ``request``'s reply: an answer held to a schema is not watched
    (the reply cap bounds it; its thinking is), and a reply carried on (``continue``: the
    request ends with the model's own words) goes on past the repetition they end with."""
    last = request.messages[-1] if request.messages else None
    carried = last.content if last is not None and last.role == "assistant" else ""
    return ReplyWatch(schema=request.schema is not None, carried=carried)


async def pump(
    at: Attempt,
    made: Backend,
    request: ChatRequest,
    *,
    on_end: Callable[[], None],
    watch: ReplyWatch | None = None,
) -> Streamed:
    """Read the backend's stream into the reply (which makes it durable, see
    :meth:`LiveReply.attempt`); raises Cancelled on the agent's cancel, Gone when the
    folder is deleted. The request goes out first, while the reply's first state write is
    made; ``on_end`` (the slot's release) runs as soon as the stream ends. A reply ``watch``
    sees stuck in a loop is stopped there: the stream is closed (the server stops generating)
    and what was said is kept (``Streamed.repeating`` says what repeated)."""
    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
    budget = at.rt.settings.escalation.time_budget if at.on.rung is not None else 0.0
    deadline = time.monotonic() + budget if budget else None  # a ladder's time budget
    stream = await opened(at, made, request)  # a panel's seat asked ahead: its held one
    first = asyncio.ensure_future(anext(stream, None))  # the request goes out now...
    async with at.reply.attempt() as feed:  # ...while the write that journals the reply is made

        def stop(ev: StreamEvent) -> bool:
            nonlocal next_check
            if watch is not None and (loop := watch.feed(ev.kind, ev.text)) is not None:
                feed.got.repeating = loop.describe()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                feed.got.over_time = budget
                return True
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
                at.turn.check_cancel()
                if not at.conv.dir.is_dir():
                    raise Gone
            return False

        try:
            await feed.drain(stream, first, stop=stop)
            await stream.aclose()
            on_end()  # the server is done with this request: the slot goes on
        finally:
            await stream.aclose()
    return feed.got
