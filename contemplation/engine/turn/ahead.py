"""A panel's round in parallel: the turn's side of :mod:`contemplation.engine.prefetch`.

When a seat's turn begins and other seats of the panel want a turn too (a round's first
seat, or a later one after a restart), their requests are built from the same log
(:func:`plan_round`: a seat's thread holds none of the other seats' blocks of the round, so
its request now is the one its own turn will build; the synthesizing seat, which weighs the
others' answers, never) and, once this turn holds its own slot, sent at once where a slot is
free with no turn waiting for it, or where the server runs different models at once and the
seat's model is not running there yet (Ollama: a side slot, see
:mod:`contemplation.engine.scheduler`) (:func:`start`; never on a one-slot server, never a
slot another conversation waits for). A seat's turn takes its prefetch's slot (:func:`slot`) and
its held stream when it sends exactly the request that was sent ahead (:func:`opened`); any
difference and it is sent anew.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from contemplation.backends.base import Backend
from contemplation.engine.prefetch import Prefetched
from contemplation.engine.provider import Provider
from contemplation.engine.scheduler import Held, slot_any
from contemplation.engine.turn.fit import capped, plan
from contemplation.engine.turn.prepare import prepare
from contemplation.engine.turn.state import Attempt, Turn
from contemplation.models import ChatRequest, Metadata, StreamEvent
from contemplation.protocol import panel
from contemplation.protocol.conversation import awaiting, next_action
from contemplation.store import attachments

log = structlog.get_logger("contemplation.turn")


@dataclass(frozen=True, slots=True)
class Later:
    """A later seat's request, built ahead: its turn key, its metadata as served, the
    providers it may run on and the exact request its turn will send."""

    key: str
    served: Metadata
    providers: tuple[Provider, ...]
    request: ChatRequest


async def plan_round(turn: Turn) -> list[Later]:
    """The requests of the panel's other seats that want a turn now (not the synthesizing
    seat; none asked ahead already), built from the log as it is in this step."""
    ahead, w = turn.ahead, turn.w
    meta = w.meta
    if ahead is None or not meta.panel or len(meta.panel) < 2:
        return []
    if meta.synthesize is not None and meta.model_label == meta.synthesize.label:
        return []
    others = [s.label for s in meta.panel if s.label != meta.model_label]
    others = [o for o in others if not ahead.has(f"{turn.conv.id}#{o}")]
    if not others:
        return []
    parsed = await turn.seen.view(turn.conv, meta.agent_label).refreshed(fd=w.fd)
    out: list[Later] = []
    for label in others:  # a seat that answered already is left at once (nothing prepared)
        seat = meta.as_seat(label)
        seen = panel.view(seat, parsed.blocks, label)
        if next_action(seen, awaiting(w.state, seat)).action != "turn":
            continue
        got = await _later(turn, seat, f"{turn.conv.id}#{label}")
        if got is not None:
            out.append(got)
    return out


async def _later(turn: Turn, seat: Metadata, key: str) -> Later | None:
    rt = turn.rt
    target, lineup = rt.route(seat)
    usable = [p for p in lineup.values() if p.guard(target.model).resting() is None]
    if not usable:
        return None
    for provider in usable:
        await provider.limits()
    served = seat.model_copy(
        update={"model": target.model, "options": target.options, "think": target.think}
    )
    prepared = await prepare(turn, served, usable)
    if prepared.error is not None:
        return None
    planned = await plan(turn, prepared, seat=seat)
    if planned is None or planned.summarise:  # a summary call first: its own turn makes it
        return None
    request = planned.request
    if attachments.carries_images(request):  # images' bytes are read by its own turn
        return None
    request = capped(request, planned.window, rt.settings.reply_cap)
    return Later(key, served, tuple(usable), request)


def start(turn: Turn, later: Sequence[Later]) -> None:
    """Send the ``later`` seats' requests now, each where a slot is free and no turn waits
    for one (this turn holds its own already); a seat with none waits for its turn."""
    ahead, rt = turn.ahead, turn.rt
    if ahead is None:
        return
    for seat in later:
        if ahead.has(seat.key):
            continue
        for provider in seat.providers:
            held = provider.scheduler.try_slot(seat.served.model)
            if held is not None:
                break
        else:
            log.info("prefetch_no_slot", key=seat.key)
            continue
        opener = _opener(provider, seat, held)
        ahead.put(
            Prefetched(
                seat.key,
                provider.name,
                seat.request,
                held,
                opener,
                limit=rt.settings.max_reply_bytes,
            )
        )


def _opener(
    provider: Provider, seat: Later, held: Held
) -> Callable[[], Awaitable[tuple[int | None, AsyncGenerator[StreamEvent, None]]]]:
    async def send() -> tuple[int | None, AsyncGenerator[StreamEvent, None]]:
        slot = await provider.name_slot(seat.key, seat.served, held)
        stream = provider.pinned(slot).stream(seat.request)
        return slot, stream

    return send


@contextlib.asynccontextmanager
async def slot(
    turn: Turn,
    pool: Sequence[Provider],
    model: str,
    served: Metadata,
) -> AsyncIterator[tuple[Provider, Held, int | None]]:
    """The turn's provider, scheduler slot and server slot: its seat's prefetch's when it
    has one on a provider of ``pool``, else the first free one (:func:`slot_any`). Its
    prefetch, if it did not take it, is closed however the turn ends."""
    ahead = turn.ahead
    hosts = {p.name: p for p in pool}
    got = await ahead.claim(turn.key, list(hosts)) if ahead is not None else None
    try:
        if got is not None:
            try:
                yield hosts[got.provider], got.held, got.slot
            finally:
                got.held.release()
            return
        async with slot_any([(p.name, p.scheduler) for p in pool], model) as (name, held):
            host = hosts[name]
            yield host, held, await host.name_slot(turn.key, served, held)
    finally:
        if ahead is not None:
            await ahead.drop(turn.key)


async def opened(
    at: Attempt, made: Backend, request: ChatRequest
) -> AsyncGenerator[StreamEvent, None]:
    """The turn's stream: its seat's held one when that was sent as exactly ``request`` on
    this provider, else ``request`` sent now."""
    ahead = at.turn.ahead
    if ahead is not None:
        held = await ahead.take(at.turn.key, at.on.provider, request)
        if held is not None:
            return held
    return made.stream(request)
