"""A panel's later seats asked at once: their replies' streams begun early and held in memory.

When a round begins, the seats that are not first have their requests sent while the first
seat streams into the log (:mod:`contemplation.engine.turn.ahead` decides which, and when).
Each such request is a :class:`Prefetched`: a task that reads the backend's stream into
memory, bounded (``limit`` bytes of text, :data:`MAX_EVENTS` events: past either it stops
holding, closes the stream and the seat is asked afresh). A request the server refused
before any event (a model it does not have) is not sent again: the seat's turn takes that
failure as its own (:meth:`Ahead.take`), so a seat is asked once per turn either way.
The log has one writer: a held stream writes nothing; the seat's own turn later takes it
(:meth:`Ahead.take`: only for the exact request it would send) and drains the held events,
then the rest live, through the turn's ordinary path. :class:`Ahead` holds one session's
prefetches (one hold of a conversation's lock); what is left when the session ends (a
cancel, a stop, the folder gone, an error) is closed: tasks cancelled and awaited, streams
closed, slots given back. A crash loses only held events: nothing of them was written, so
the seat is asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from contemplation.engine.scheduler import Held
from contemplation.errors import BackendError, ContemplationError
from contemplation.models import ChatRequest, StreamEvent

log = structlog.get_logger("contemplation.prefetch")

MAX_EVENTS = 65_536  # events held for one seat (a stream of empty pieces stays bounded)


Opener = Callable[[], Awaitable[tuple[int | None, AsyncGenerator[StreamEvent, None]]]]


@dataclass(eq=False)
class Prefetched:
    """One seat's request sent early: ``key`` the seat's turn key (``conv#SEAT``), the
    ``provider`` it runs on with the scheduler slot ``held``, the exact ``request`` sent
    (``opener`` sends it, naming a server slot: ``slot``), and its events held until its
    turn takes them."""

    key: str
    provider: str
    request: ChatRequest
    held: Held
    opener: Opener
    limit: int  # bytes of text held at most (the reply cap)
    slot: int | None = None
    stream: AsyncGenerator[StreamEvent, None] | None = None
    events: list[StreamEvent] = field(default_factory=list)
    size: int = 0
    ended: bool = False  # the stream ended by itself: every event is held
    dropped: str = ""  # why it cannot be used (over its bound, a backend error)
    error: BackendError | None = None  # the server refused it before any event: the turn's
    claimed: bool = False  # its seat's turn holds its slot
    taken: bool = False  # its seat's turn took its stream (or found it unfit)
    _adopted: bool = False
    _opened: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def begin(self) -> Prefetched:
        self._task = asyncio.create_task(self._hold(), name=f"prefetch {self.key}")
        return self

    async def ready(self) -> None:
        """Until the request is sent (or failed to be)."""
        await self._opened.wait()

    async def _hold(self) -> None:
        try:
            self.slot, self.stream = await self.opener()
            self._opened.set()
            while not self._adopted:
                ev = await anext(self.stream, None)
                if ev is None:
                    self.ended = True
                    return
                self.events.append(ev)
                self.size += len(ev.text.encode("utf-8"))
                if self.size > self.limit or len(self.events) > MAX_EVENTS:
                    self._drop(f"over its bound ({self.size} bytes, {len(self.events)} events)")
                    await self.stream.aclose()  # the server stops generating
                    return
        except (ContemplationError, OSError) as exc:  # its own turn asks afresh
            if isinstance(exc, BackendError) and not self.events:
                self.error = exc  # ... unless it was refused outright: its turn fails so
            self._drop(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # unexpected: never left to the loop's handler
            log.exception("prefetch_failed", key=self.key)
            self._drop(f"{type(exc).__name__}: {exc}")
        finally:
            self._opened.set()

    def _drop(self, why: str) -> None:
        self.dropped, self.events, self.size = why, [], 0
        log.info("prefetch_dropped", key=self.key, why=why)

    async def replay(self) -> AsyncGenerator[StreamEvent, None]:
        """The held events, then the rest of the stream live (the holding task stopped
        after the event it is waiting for); the stream is closed however this ends."""
        self._adopted = True
        try:
            if self._task is not None:
                await asyncio.wait([self._task])
            held, self.events = self.events, []
            for ev in held:
                yield ev
            if self.stream is not None and not self.ended and not self.dropped:
                async for ev in self.stream:
                    yield ev
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop holding: the task cancelled and awaited, the stream closed (the server stops
        generating). Its slot is given back by whoever holds it (:meth:`Ahead.close`)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.wait([task])
        if self.stream is not None:
            with contextlib.suppress(ContemplationError, OSError, RuntimeError):
                await self.stream.aclose()
        self.events = []


async def _refused(exc: BackendError) -> AsyncGenerator[StreamEvent, None]:
    """The stream of a request the server refused when it was sent ahead: it fails so."""
    if exc is not None:
        raise exc
    yield StreamEvent(kind="done")  # (never: a generator, as a stream is)


@dataclass
class Ahead:
    """The prefetches of one session (one hold of a conversation's lock), by seat key."""

    entries: dict[str, Prefetched] = field(default_factory=dict)

    def has(self, key: str) -> bool:
        return key in self.entries

    def put(self, entry: Prefetched) -> None:
        self.entries[entry.key] = entry.begin()
        log.info("prefetch_started", key=entry.key, provider=entry.provider, slot=entry.slot)

    async def claim(self, key: str, providers: list[str]) -> Prefetched | None:
        """The prefetch of ``key``'s seat when it runs on one of ``providers`` and its
        request went out: its turn takes its slot (so a request is never counted twice).
        One that failed is closed and its slot given back."""
        entry = self.entries.get(key)
        if entry is None or entry.claimed or entry.provider not in providers:
            return None
        await entry.ready()
        if entry.error is None and (entry.dropped or entry.stream is None):
            await self.drop(key)
            return None
        entry.claimed = True
        return entry

    async def take(
        self, key: str, provider: str, request: ChatRequest
    ) -> AsyncGenerator[StreamEvent, None] | None:
        """The held stream of ``key``'s seat when it was sent on ``provider`` as exactly
        ``request`` and is still whole; else None (any prefetch of it closed: the turn
        sends ``request`` anew)."""
        entry = self.entries.get(key)  # kept until :meth:`drop`: closed however the turn ends
        if entry is None or entry.taken:
            return None
        entry.taken = True
        if entry.error is not None and entry.provider == provider and entry.request == request:
            log.info("prefetch_refused", key=key, error=str(entry.error))
            await entry.close()
            return _refused(entry.error)  # the same request: not sent a second time
        why = entry.dropped
        if not why and entry.provider != provider:
            why = "another provider"
        if not why and entry.request != request:
            why = "the request differs from the one sent ahead"
        if why:
            log.info("prefetch_not_used", key=key, why=why)
            await entry.close()
            return None
        log.info("prefetch_used", key=key, held=len(entry.events), ended=entry.ended)
        return entry.replay()

    async def drop(self, key: str) -> None:
        """``key``'s prefetch, if its turn did not take it, closed."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            await self._close(entry)

    async def _close(self, entry: Prefetched) -> None:
        try:
            await entry.close()
        finally:
            if not entry.claimed:
                entry.held.release()

    async def close(self) -> None:
        """Every prefetch left closed (the session ends: the round done, cancelled, the
        conversation gone, the daemon stopping)."""
        while self.entries:
            _, entry = self.entries.popitem()
            log.info("prefetch_discarded", key=entry.key)
            await self._close(entry)
