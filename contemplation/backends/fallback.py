"""A backend that hands a turn to the next one when a server cannot be reached.

Only ``kind == "unreachable"`` (connection refused, no route, DNS, connect timeout) moves a turn
on, and only before the first event: a server that answers — even with an error — keeps the
turn, so a reply is never stitched from two models. The switch is recorded in the log as a
``note`` event ("ollama unreachable (...); this reply comes from local").

Every backend in the chain gets the same request, model name included; single-model servers
(llama-cpp-python's server, the local backend) answer whatever the name.

A backend found unreachable *rests*: for REST_FIRST seconds, doubled at each failed try up to
REST_MAX, it is asked only after the others (so a dead primary does not cost every turn its
connect timeout), and its first answer ends the rests. Each pass-over and each try again is a
log line; the note of a passed-over backend says so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

import structlog

from contemplation.backends.base import Backend, Capabilities, Check
from contemplation.errors import BackendError, ErrorKind
from contemplation.models import BackendSession, ChatRequest, StreamEvent

log = structlog.get_logger("contemplation.backends.fallback")

REST_FIRST = 4.0  # seconds an unreachable backend is passed over after its first failure
REST_MAX = 120.0  # the longest rest, however often it failed


@dataclass
class _Rest:
    """An unreachable backend's rest: until when (on the monotonic clock), how long the last
    one was, and the failure that began it (what the note of a pass-over says)."""

    until: float
    seconds: float
    why: BackendError


class FallbackBackend:
    def __init__(
        self, chain: Sequence[Backend], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not chain:
            raise ValueError("a fallback chain needs at least one backend")
        self.chain = tuple(chain)
        self._clock = clock
        self._rests: dict[int, _Rest] = {}  # by place in the chain: one entry a backend at most
        primary = self.chain[0]
        self.name = primary.name
        self.label = primary.label
        self.concurrency = primary.concurrency

    def _order(self) -> tuple[list[int], dict[int, float]]:
        """The chain's places in the order to ask them now: the resting ones after the others
        (never left out: with every one down each is still asked), and the seconds each of
        those has left."""
        now = self._clock()
        left = {i: r.until - now for i, r in self._rests.items() if r.until > now}
        return sorted(range(len(self.chain)), key=lambda i: i in left), left

    def _failed(self, i: int, exc: BackendError) -> None:
        """``exc`` is unreachable: the backend rests, twice as long as the last time."""
        last = self._rests.get(i)
        seconds = min(REST_MAX, last.seconds * 2) if last is not None else REST_FIRST
        self._rests[i] = _Rest(self._clock() + seconds, seconds, exc)

    def _passed_over(self, i: int, left: float) -> str:
        """A resting backend ahead of the one that answered was not asked: the log line, and
        the words of the note."""
        name, rest = self.chain[i].name, self._rests[i]
        log.info("fallback_skipped", backend=name, for_s=round(left, 1))
        return f"{name} unreachable ({rest.why}; passed over, tried again in {left:.0f} s)"

    def _answered(self, i: int) -> None:
        if self._rests.pop(i, None) is not None:
            log.info("fallback_back", backend=self.chain[i].name)

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        skipped: list[tuple[str, BackendError]] = []
        order, left = self._order()
        for i in order:
            backend = self.chain[i]
            rest = self._rests.get(i)
            if rest is not None:  # its rest is over, or every other one failed this turn
                log.info("fallback_tried_again", backend=backend.name, rested_s=rest.seconds)
            events = backend.stream(request)
            try:
                try:
                    first = await anext(events)
                except StopAsyncIteration:
                    self._answered(i)
                    return
                except BackendError as exc:
                    if exc.kind != "unreachable":
                        raise
                    self._failed(i, exc)
                    skipped.append((backend.name, exc))
                    continue
                self._answered(i)
                passed = [self._passed_over(j, left[j]) for j in sorted(left) if j < i]
                if skipped or passed:
                    why = "; ".join(
                        [*passed, *(f"{name} unreachable ({exc})" for name, exc in skipped)]
                    )
                    yield StreamEvent("note", text=f"{why}; this reply comes from {backend.name}")
                yield first
                async for ev in events:
                    yield ev
                return
            finally:
                await events.aclose()
        first_error = skipped[0][1]
        others = ", ".join(n for n, _ in skipped[1:])
        raise BackendError(
            f"{first_error}; the fallbacks ({others}) were unreachable too"
            if others
            else str(first_error),
            transient=True,
            kind=ErrorKind.UNREACHABLE,
        ) from first_error

    async def capabilities(self, model: str) -> Capabilities:
        errors: list[BackendError] = []
        for i in self._order()[0]:  # a resting backend last here too
            try:
                got = await self.chain[i].capabilities(model)
            except BackendError as exc:
                if exc.kind != "unreachable":
                    raise
                self._failed(i, exc)
                errors.append(exc)
                continue
            self._answered(i)
            return got
        raise errors[0]

    async def models(self) -> list[str]:
        return await self.chain[0].models()

    async def check(self, model: str | None) -> list[Check]:
        checks: list[Check] = []
        for i, backend in enumerate(self.chain):
            checks.extend(await backend.check(model if i == 0 else None))
        return checks

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        for backend in self.chain:
            with contextlib.suppress(Exception):
                await backend.forget(conversation_id, session)

    async def aclose(self) -> None:
        for backend in self.chain:
            with contextlib.suppress(Exception):
                await backend.aclose()
