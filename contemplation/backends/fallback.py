"""A backend that hands a turn to the next one when a server cannot be reached.

Only ``kind == "unreachable"`` (connection refused, no route, DNS, connect timeout) moves a turn
on, and only before the first event: a server that answers — even with an error — keeps the
turn, so a reply is never stitched from two models. The switch is recorded in the log as a
``note`` event ("ollama unreachable (...); this reply comes from local").

Every backend in the chain gets the same request, model name included; single-model servers
(llama-cpp-python's server, the local backend) answer whatever the name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence

from contemplation.backends.base import Backend, Capabilities, Check
from contemplation.errors import BackendError, ErrorKind
from contemplation.models import BackendSession, ChatRequest, StreamEvent


class FallbackBackend:
    def __init__(self, chain: Sequence[Backend]) -> None:
        if not chain:
            raise ValueError("a fallback chain needs at least one backend")
        self.chain = tuple(chain)
        primary = self.chain[0]
        self.name = primary.name
        self.label = primary.label
        self.concurrency = primary.concurrency

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        skipped: list[tuple[str, BackendError]] = []
        for backend in self.chain:
            events = backend.stream(request)
            try:
                try:
                    first = await anext(events)
                except StopAsyncIteration:
                    return
                except BackendError as exc:
                    if exc.kind != "unreachable":
                        raise
                    skipped.append((backend.name, exc))
                    continue
                if skipped:
                    why = "; ".join(f"{name} unreachable ({exc})" for name, exc in skipped)
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
        for backend in self.chain:
            try:
                return await backend.capabilities(model)
            except BackendError as exc:
                if exc.kind != "unreachable":
                    raise
                errors.append(exc)
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
