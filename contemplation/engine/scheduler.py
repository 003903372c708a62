"""Turn slots per provider, queued per model.

A provider allows ``slots`` turns at once (its server's own figure when it says, see
:meth:`ModelScheduler.resize`); a turn of an alias over several providers waits in each of
their queues at once and takes the first free slot (:func:`slot_any`: least busy first, the
configured order on ties). Waiting turns are queued by model, and a free slot
goes to the model that ran last while it still has turns waiting, so two conversations on
different models do not make the server swap models in and out on every turn. After
``switch_after`` turns in a row on one model while another model waits, the longest-waiting
other model gets the slot (no starvation).

A server that runs different models at once by itself (``models_at_once``: Ollama, whose own
scheduler loads them side by side, up to ``OLLAMA_MAX_LOADED_MODELS``, and queues or evicts
when memory is short) also lends a *side slot* to a panel's seat asked ahead
(:meth:`ModelScheduler.try_slot`) whose model is not running there yet, beyond ``slots``: a
round's seats on different models go out together. Side slots never count against the
turns queued here, and none is lent while a turn waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

GRANTS_KEPT = 256
SWEEP_AT = 256  # a queue this long is swept of waiters another provider took
MAX_SIDE = 8  # side slots lent at once (a panel's seats: protocol.panel.MAX_MEMBERS)


class Held:
    """A granted slot; :meth:`release` gives it back early (once the server is done with the
    turn, before the reply is committed), and leaving the ``slot()`` block releases it."""

    def __init__(self, scheduler: ModelScheduler, model: str = "", *, side: bool = False) -> None:
        self._scheduler: ModelScheduler | None = scheduler
        self._then: Callable[[], None] | None = None
        self.model, self.side = model, side
        scheduler._on(model, +1)

    def then(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once, when the slot is given back (the server slot the turn named)."""
        self._then = fn

    def release(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            then, self._then = self._then, None
            if then is not None:
                then()
            scheduler._on(self.model, -1)
            if self.side:  # lent beyond the slots: nothing queued was counting on it
                scheduler._side -= 1
                return
            scheduler._free += 1
            scheduler._dispatch()


@dataclass(eq=False)  # compared by identity: a queue's `in` and remove stay cheap
class _Waiter:
    seq: int
    future: asyncio.Future[ModelScheduler]  # shared by the queues an alias's turn waits in


@dataclass
class ModelScheduler:
    slots: int = 1
    switch_after: int = 4
    models_at_once: bool = False  # the server runs different models side by side itself
    _free: int = field(init=False)
    _side: int = field(default=0, init=False)  # side slots lent (see the module's text)
    _models: dict[str, int] = field(default_factory=dict, init=False)  # running, by model
    _queues: dict[str, deque[_Waiter]] = field(default_factory=dict, init=False)
    _current: str | None = field(default=None, init=False)
    _streak: int = field(default=0, init=False)
    _seq: itertools.count[int] = field(default_factory=itertools.count, init=False)
    granted: list[str] = field(default_factory=list, init=False)  # recent grants (tests, metrics)

    def __post_init__(self) -> None:
        self._free = self.slots

    @property
    def waiting(self) -> int:
        """Turns waiting here (not those an alias's other provider has taken meanwhile)."""
        return sum(1 for q in self._queues.values() for w in q if not w.future.done())

    @property
    def running(self) -> int:
        return self.slots - self._free

    @property
    def load(self) -> float:
        """How busy: turns running per slot (least busy first when an alias picks)."""
        return self.running / self.slots

    def _on(self, model: str, n: int) -> None:
        left = self._models.get(model, 0) + n
        if left > 0:
            self._models[model] = left
        else:
            self._models.pop(model, None)

    def resize(self, slots: int, *, models_at_once: bool | None = None) -> None:
        """The server said how many slots it has (at start, after it restarted): turns
        running now keep theirs; a smaller figure holds new turns back until enough end.
        ``models_at_once``: whether it runs different models side by side (None: as was)."""
        if models_at_once is not None:
            self.models_at_once = models_at_once
        slots = max(1, slots)
        self._free += slots - self.slots
        self.slots = slots
        self._dispatch()

    def _enqueue(self, model: str, waiter: _Waiter) -> None:
        """Join ``model``'s queue. Waiters another provider granted are passed over when
        they reach the head (never searched for: a burst of thousands stays linear); a long
        queue is swept of them now and then, so a provider whose slots stay busy does not
        collect them."""
        queue = self._queues.setdefault(model, deque())
        if len(queue) >= SWEEP_AT and len(queue) % SWEEP_AT == 0:
            live = [w for w in queue if not w.future.done()]
            queue.clear()
            queue.extend(live)
        queue.append(waiter)

    def _give_back(self) -> None:
        self._free += 1
        self._dispatch()

    def _pick(self) -> str | None:
        live = {m: q for m, q in self._queues.items() if q}
        if not live:
            return None
        others = [m for m in live if m != self._current]
        if self._current in live and (self._streak < self.switch_after or not others):
            return self._current
        return min(others or list(live), key=lambda m: live[m][0].seq)

    def _dispatch(self) -> None:
        while self._free > 0:
            model = self._pick()
            if model is None:
                return
            waiter = self._queues[model].popleft()
            if waiter.future.done():  # cancelled while waiting
                continue
            self._free -= 1
            if model == self._current:
                self._streak += 1
            else:
                self._current, self._streak = model, 1
            self.granted.append(model)
            if len(self.granted) > 2 * GRANTS_KEPT:  # a daemon runs for months: stay bounded
                del self.granted[:-GRANTS_KEPT]
            waiter.future.set_result(self)

    def try_slot(self, model: str = "") -> Held | None:
        """A slot now, without waiting, for a turn of ``model``: only when no turn waits here
        (a panel's seat asked ahead never takes a slot a turn is queued for), and one is free
        or, on a server that runs different models at once, ``model`` is not running here
        yet (a side slot, lent beyond ``slots``). Held until released."""
        if self.waiting:
            return None
        if self._free > 0:
            self._free -= 1
            return Held(self, model)
        if self.models_at_once and model and model not in self._models and self._side < MAX_SIDE:
            self._side += 1
            return Held(self, model, side=True)
        return None

    @contextlib.asynccontextmanager
    async def slot(self, model: str) -> AsyncIterator[Held]:
        fut: asyncio.Future[ModelScheduler] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._seq), fut)
        queue = self._queues.setdefault(model, deque())
        queue.append(waiter)
        self._dispatch()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._free += 1
                self._dispatch()
            elif waiter in queue:  # cancelled while queued: not waiting any more
                queue.remove(waiter)
            raise
        held = Held(self, model)
        try:
            yield held
        finally:
            held.release()


@contextlib.asynccontextmanager
async def slot_any(
    pool: Sequence[tuple[str, ModelScheduler]], model: str
) -> AsyncIterator[tuple[str, Held]]:
    """The first free slot among ``pool``'s providers, and which provider it is on.

    The turn waits in every provider's queue with one future: the first scheduler to reach
    it grants it, the others find it done and pass over it. Joining, it is offered to the
    least busy provider first (the pool's order on ties), so a burst spreads evenly."""
    if len(pool) == 1:
        name, only = pool[0]
        async with only.slot(model) as held:
            yield name, held
        return
    fut: asyncio.Future[ModelScheduler] = asyncio.get_running_loop().create_future()
    waiters = [(sched, _Waiter(next(sched._seq), fut)) for _, sched in pool]
    for sched, waiter in waiters:
        sched._enqueue(model, waiter)
    for i in sorted(range(len(pool)), key=lambda i: (pool[i][1].load, i)):
        if fut.done():
            break
        pool[i][1]._dispatch()
    try:
        granted = await fut
    except asyncio.CancelledError:  # the other queues pass over the cancelled future
        if fut.done() and not fut.cancelled():
            fut.result()._give_back()
        raise
    held = Held(granted, model)
    try:
        yield next(name for name, sched in pool if sched is granted), held
    finally:
        held.release()
