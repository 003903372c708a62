"""A plugin's backend, held to the bounds every built-in kind keeps for itself.

A built-in kind times each phase of its own protocol (:class:`~contemplation.backends.base.
TimedLines`) and raises only :class:`~contemplation.errors.BackendError`. A plugin's code is
not ours: :class:`Guarded` wraps what its kind makes so that a stream which sends nothing
for ``first_byte`` s, then nothing for ``idle`` s, or runs past ``total`` s is a transient
timeout (retried like any server's), anything else it raises (``BaseException`` included:
``KeyboardInterrupt``, ``SystemExit``, a ``CancelledError`` of its own) is one ERROR for that
turn naming the plugin, and its other calls (``capabilities``, ``check``, ``models``,
``forget``, ``aclose``) are bounded by :data:`CALL_LIMIT`. A cancel of the daemon's own task
(the agent's cancel, a stop) goes on through it (:func:`contemplation.base.contained.ours`). Its
bounds are the provider table's ``timeouts`` (``[plugins.<name>.timeouts]`` or
``[providers.<name>.timeouts]``), else the defaults every kind has. So a plugin that raises or
hangs in an ``await`` costs that turn, never the daemon; one that blocks the event loop or
ends the process cannot be contained here (docs/guides/plugins.md says how that is noticed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from contemplation.base.contained import described, ours
from contemplation.errors import BackendError, ErrorKind

if TYPE_CHECKING:
    from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
    from contemplation.models import BackendSession, ChatRequest, StreamEvent

CALL_LIMIT = 30.0  # seconds for any call other than stream
T = TypeVar("T")


class Guarded:
    """``inner`` (made by the plugin ``plugin``) held to ``t``; every other attribute (its
    ``slots``, ``structured_output``, ...) is the plugin's own."""

    def __init__(self, inner: Backend, plugin: str, t: PhaseTimeouts) -> None:
        self._inner, self.plugin, self.t = inner, plugin, t
        self.name, self.label, self.concurrency = inner.name, inner.label, inner.concurrency

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _failed(self, exc: BaseException, what: str) -> BackendError:
        return BackendError(
            f"the backend of plugin {self.plugin} failed in {what}: {described(exc)}",
            transient=False,
            kind=ErrorKind.BACKEND,
        )

    async def _bounded(self, call: Awaitable[T], what: str) -> T:
        try:
            async with asyncio.timeout(CALL_LIMIT):
                return await call
        except BackendError:
            raise
        except TimeoutError:
            raise BackendError(
                f"the backend of plugin {self.plugin} did not answer {what} within "
                f"{CALL_LIMIT:g} s",
                transient=True,
                kind=ErrorKind.TIMEOUT,
            ) from None
        except BaseException as exc:  # the plugin's bug: its turn's error, not ours
            if ours(exc):
                raise
            raise self._failed(exc, what) from exc

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        try:
            events = self._inner.stream(request)
        except BaseException as exc:  # a plain function that raised before any await
            raise self._failed(exc, "its stream") from exc
        deadline = time.monotonic() + self.t.total
        first = True
        try:
            while True:
                limit = self.t.first_byte if first else self.t.idle
                wait = min(limit, deadline - time.monotonic())
                try:
                    async with asyncio.timeout(max(wait, 0.0)):
                        event = await anext(events, None)
                except BackendError:
                    raise
                except TimeoutError:
                    raise self._late(first, limit, deadline) from None
                except BaseException as exc:
                    if ours(exc):
                        raise
                    raise self._failed(exc, "its stream") from exc
                if event is None:
                    return
                first = False
                yield event
        finally:
            await self._closed(events)

    async def _closed(self, events: AsyncGenerator[StreamEvent, None]) -> None:
        """Close the plugin's stream; whatever it raises on the way is dropped, but for a
        cancel of our own (raised once the stream is closed)."""
        try:
            async with asyncio.timeout(CALL_LIMIT):
                await events.aclose()
        except BaseException as exc:
            if ours(exc):
                raise

    def _late(self, first: bool, limit: float, deadline: float) -> BackendError:
        if time.monotonic() >= deadline - 0.001:
            return BackendError(
                f"the reply took longer than the total cap of {self.t.total:g} s",
                transient=True,
                kind=ErrorKind.TIMEOUT,
            )
        said = "nothing" if first else "no more"
        return BackendError(
            f"the backend of plugin {self.plugin} sent {said} for {limit:g} s (stalled)",
            transient=True,
            kind=ErrorKind.TIMEOUT if first else ErrorKind.STALL,
        )

    async def capabilities(self, model: str) -> Capabilities:
        return await self._bounded(self._inner.capabilities(model), "capabilities")

    async def check(self, model: str | None) -> list[Check]:
        return await self._bounded(self._inner.check(model), "check")

    async def models(self) -> list[str]:
        return await self._bounded(self._inner.models(), "models")

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        with contextlib.suppress(BackendError):  # forget never raises (the contract)
            await self._bounded(self._inner.forget(conversation_id, session), "forget")

    async def aclose(self) -> None:
        with contextlib.suppress(BackendError):
            await self._bounded(self._inner.aclose(), "aclose")
