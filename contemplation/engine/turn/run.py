"""The turn's chain: prepare (:mod:`.prepare`), plan and fit (:mod:`.fit`), await a slot,
stream (:mod:`.stream`) and end (:mod:`.end`, or :mod:`.retrying` when it did not end with
a reply). Each phase takes the turn's state (:mod:`.state`), never its pieces."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import replace

import structlog

from contemplation.engine import escalation
from contemplation.engine.scheduler import Held
from contemplation.engine.steps import AGAIN, Outcome
from contemplation.engine.turn import ahead
from contemplation.engine.turn.end import finish
from contemplation.engine.turn.fit import fit, plan, with_images
from contemplation.engine.turn.prepare import prepare
from contemplation.engine.turn.retrying import (
    cancelled,
    crashed,
    failed,
    rest,
    unusable,
    write_failed,
)
from contemplation.engine.turn.state import Attempt, Cancelled, Gone, On, Prepared, Turn
from contemplation.engine.turn.stream import refitted
from contemplation.errors import BackendError, ContemplationError
from contemplation.models import (
    ChatRequest,
    ConvEvent,
    MarkerKind,
    Status,
)
from contemplation.prompt import budget
from contemplation.store import attachments
from contemplation.writer import Streamed

log = structlog.get_logger("contemplation.turn")


async def run_turn(turn: Turn) -> Outcome:
    """The model's turn, under the lock and writer of the step that decided it."""
    rt, w = turn.rt, turn.w
    meta = w.meta
    rung = await _rung(turn)
    # its providers, each asked by the turn from here on (moved by a rung of its ladder)
    steer = (
        None if rung is None else functools.partial(escalation.target, rt.settings, meta, at=rung)
    )
    target, lineup = rt.route(meta, w.state.backend_session, steer=steer)
    if (stop := unusable(turn, lineup)) is not None:
        return stop
    guards = {p: lineup[p].guard(target.model) for p in target.providers}
    usable = [p for p in target.providers if guards[p].resting() is None]
    if not usable:  # every provider rests: wait for the first to be tried again
        until = min(t for g in guards.values() if (t := g.resting()) is not None)
        return rest(rt, w, until, target)
    for name in usable:
        await lineup[name].limits()  # its slots, asked once (again after it went away)
    served = meta.model_copy(
        update={"model": target.model, "options": target.options, "think": target.think}
    )
    prepared = _on_rung(await prepare(turn, served, [lineup[p] for p in usable]), rung)
    if w.state.turns == 0 and prepared.context:  # the context the daemon read, once
        w.context_read(len(prepared.context.encode()))
    # the request is built while the slots may still be busy
    planned = await plan(turn, prepared)
    if planned is None:
        return AGAIN
    later = await ahead.plan_round(turn)  # a panel's other seats due: asked at once
    pool = [lineup[p] for p in usable]
    asked = time.monotonic()
    async with ahead.slot(turn, pool, target.model, served) as (host, held, n):
        provider = host.name
        on = On(
            provider, target, guards[provider], host, (time.monotonic() - asked) * 1000, slot=n,
            rung=rung,
        )  # fmt: skip
        # checked again with the slot held: the turns queued behind a failing one must not
        # each try the server once more; one whose alias has a provider not resting goes
        # there at once instead of waiting out this one's rest
        if not on.guard.allow():
            if any(g.resting() is None for p, g in guards.items() if p != provider):
                return AGAIN
            until = on.guard.resting() or rt.clock() + 0.5
        else:
            try:
                if _grown(turn):  # written into while the turn waited: its request again
                    planned = await plan(turn, prepared)
                    if planned is None:
                        return AGAIN
                else:
                    ahead.start(turn, later)  # with this turn's slot held
                return await _stream(turn, prepared, on, held, planned)
            finally:
                on.guard.release()  # a probe that ended without a verdict lets another try
    return rest(rt, w, until, target)


async def _rung(turn: Turn) -> escalation.At | None:
    """Where the turn stands on its conversation's escalation ladder (None: it has none)."""
    rt, w = turn.rt, turn.w
    try:
        tpl = rt.template(w.meta.template) if w.meta.template else None
    except ContemplationError:
        tpl = None
    lad = escalation.ladder(rt.settings, w.meta, tpl)
    if lad is None:
        return None
    view = turn.seen.view(turn.conv, w.meta.agent_label)
    parsed = await view.refreshed(fd=w.fd)
    at = escalation.where(lad, parsed.blocks)
    if at is not None and at.seat is not None and view.bare_count:  # rotated between seats
        seats = escalation.seats(parsed.blocks, at.seat.rung)
        blocks = await asyncio.to_thread(view.with_texts, parsed.blocks, seats)
        at = escalation.where(lad, blocks)  # the vote needs the seats' answers, not bare
    return at


def _on_rung(prepared: Prepared, rung: escalation.At | None) -> Prepared:
    """A panel rung's seat is asked for its answer, which is compared with the others': it is
    offered no NEED lines and no tools (as a reply held to a schema)."""
    if rung is not None and rung.seat is not None:
        return replace(prepared, asking=False)
    return prepared


def _grown(turn: Turn) -> bool:
    """A write landed in the claimed message's file after it was read, and the turn has not
    begun (it waited for a slot): the block is written again, whole, as the same message.
    True: the request must be built again. A write after this point is queued as a
    follow-up when the file is released (see :meth:`ConvWriter.retake`)."""
    again, w, settings = False, turn.w, turn.rt.settings
    for path in w.changed_held():
        try:
            msg = attachments.read_claimed(path, settings.max_message_bytes, settings.attachments)
        except OSError:
            continue
        if msg.text is None or msg.seen is None or msg.note:
            continue  # unreadable now: the release queues what was added
        if w.retake(path, msg.text, msg.seen):
            log.info("message_grown", conv=w.conv.id, file=path.name, bytes=msg.seen.size)
            again = True
    return again


async def _stream(
    turn: Turn, prepared: Prepared, on: On, held: Held, planned: budget.Plan
) -> Outcome:
    conv, rt, w = turn.conv, turn.rt, turn.w
    w.generating(rt.clock())  # status shows who holds the slot, since when
    rt.notify(conv.id, ConvEvent.GENERATING, model=on.model, provider=on.provider)
    reply = w.live_reply(
        rt.committer,
        limit=rt.settings.max_reply_bytes,
        on_event=functools.partial(rt.told, conv.id),
    )
    at = Attempt(turn, prepared, on, held, reply)
    error = prepared.error or attachments.vision_error(planned.request, prepared.vision, on.model)
    if error is not None:
        return failed(at, error)
    if prepared.note:
        await reply.note(prepared.note)
    return await _run_reply(at, planned)


async def _run_reply(at: Attempt, planned: budget.Plan) -> Outcome:
    """Fit the request (a summary call at most), stream the reply and end it one of six
    ways: finished, cancelled, interrupted by a stop, failed (retry or error), cut by a
    failed write (redone once the disk has room), or crashed (redone once)."""
    conv, reply = at.conv, at.reply
    try:
        try:
            request, notes = await fit(at, planned)
            request = await with_images(at, request)  # the images' bytes, read off the loop
            for note in notes:
                await reply.note(note)
            got, planned, request = await refitted(at, planned, request)
        finally:
            at.held.release()  # the server is done with it: the commit below needs no slot
    except Cancelled:
        return cancelled(at)
    except Gone:  # the stream is closed; there is no folder left to write the outcome in
        log.warning("conversation_removed", conv=conv.id, during="a reply")
        return AGAIN
    except asyncio.CancelledError:
        if conv.id in at.turn.seen.cancelled:
            at.turn.seen.cancelled.discard(conv.id)
            return cancelled(at)
        reply.abort(
            MarkerKind.INTERRUPTED, "the daemon stopped during this reply; it will be redone"
        )
        at.w.show(Status.PENDING)
        raise
    except BackendError as exc:
        if exc.kind == "cancelled":  # the server aborted the turn at our request
            return cancelled(at)
        return failed(at, exc)
    except OSError as exc:
        return write_failed(at.turn, exc)
    except Exception as exc:  # unexpected: redone once, never at every rescan
        return crashed(at, exc)
    return await _end(at, got, request, planned)


async def _end(at: Attempt, got: Streamed, request: ChatRequest, planned: budget.Plan) -> Outcome:
    """:func:`~.end.finish`, and how it ends when it fails: a failed write, or a crash."""
    try:
        return await finish(at, got, request, planned)
    except OSError as exc:
        return write_failed(at.turn, exc)
    except Exception as exc:  # unexpected (a reply no code was ready for): redone once
        return crashed(at, exc)
