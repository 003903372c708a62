"""An in-process backend for tests: replies are queued, the requests it got are kept.

Modelled on the mock model of simonw/llm (``enqueue`` a reply, then read the history), but
speaking this project's :class:`~contemplation.backends.base.Backend` contract::

    fake = install()                                   # registered as backend "fake"
    fake.enqueue(Reply(chunks=("Hel", "lo"), usage=Usage(eval_count=2)))
    gate = asyncio.Event()
    fake.enqueue(Reply(chunks=("a", "b"), gate=gate, gate_after=1))   # holds after "a"
    fake.enqueue(Reply(error=BackendError("down", transient=True, kind="unreachable")))
    ... run the daemon's code ...
    fake.requests[0].messages[-1].content              # what the model was asked

A turn with nothing queued gets :attr:`FakeBackend.default` (one chunk, ``"ok"``). Replies
are taken in the order the streams start, whatever conversation asks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from contemplation import backends
from contemplation.backends.base import Backend, Capabilities, Check
from contemplation.models import ChatRequest, StreamEvent, Usage
from contemplation.settings import Settings


@dataclass(frozen=True)
class Reply:
    """One scripted reply, streamed as: notes, thinking, content chunks, then ``done`` (with
    ``usage``) or ``error`` raised after the chunks.

    ``gate``: the stream waits for this event after ``gate_after`` content chunks (0: before
    the first event), so a test can hold a turn in the middle of its reply, look at the
    folder, poke or cancel, and then let it go on (``gate.set()``).
    """

    chunks: Sequence[str] = ("ok",)
    thinking: Sequence[str] = ()
    notes: Sequence[str] = ()
    tool_calls: Sequence[dict[str, Any]] = ()
    usage: Usage | None = None
    error: Exception | None = None
    gate: asyncio.Event | None = None
    gate_after: int = 0


@dataclass
class FakeBackend:
    """Satisfies :class:`~contemplation.backends.base.Backend`; every call is recorded."""

    name: str = "fake"
    label: str = "FAKE"
    concurrency: int = 1
    caps: Capabilities = field(default_factory=lambda: Capabilities(source="fake"))
    default: Reply = field(default_factory=Reply)
    model_names: list[str] = field(default_factory=lambda: ["fake-model"])
    requests: list[ChatRequest] = field(default_factory=list)  # in the order streams started
    capability_calls: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    active: int = 0  # streams running now
    max_active: int = 0
    finished: int = 0  # streams that sent ``done``
    interrupted: int = 0  # streams closed or cancelled before their end
    closed: bool = False
    _queue: deque[Reply] = field(default_factory=deque)
    _waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)

    def enqueue(self, *replies: Reply) -> FakeBackend:
        """Queue replies for the next streams, first in first out."""
        self._queue.extend(replies)
        return self

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def wait_for_requests(self, n: int, within: float = 5.0) -> list[ChatRequest]:
        """Wait until ``n`` streams have started (their requests are recorded)."""
        if len(self.requests) < n:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((n, fut))
            try:
                async with asyncio.timeout(within):
                    await fut
            except TimeoutError:
                raise AssertionError(
                    f"{len(self.requests)} requests after {within} s, expected {n}"
                ) from None
            finally:
                self._waiters = [(k, f) for k, f in self._waiters if f is not fut]
        return self.requests[:n]

    def _record(self, request: ChatRequest) -> None:
        self.requests.append(request)
        for n, fut in self._waiters:
            if len(self.requests) >= n and not fut.done():
                fut.set_result(None)

    # -- the Backend contract -----------------------------------------------------------

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        reply = self._queue.popleft() if self._queue else self.default
        self._record(request)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        done = False
        try:
            for text in reply.notes:
                yield StreamEvent("note", text=text)
            for text in reply.thinking:
                yield StreamEvent("thinking", text=text)
            for i, text in enumerate(reply.chunks):
                if reply.gate is not None and i == reply.gate_after:
                    await reply.gate.wait()
                yield StreamEvent("content", text=text)
            if reply.gate is not None and reply.gate_after >= len(reply.chunks):
                await reply.gate.wait()
            for call in reply.tool_calls:
                yield StreamEvent("tool_call", tool_call=call)
            if reply.error is not None:
                raise reply.error
            done = True
            yield StreamEvent("done", usage=reply.usage)
        finally:
            self.active -= 1
            if done:
                self.finished += 1
            else:
                self.interrupted += 1

    async def capabilities(self, model: str) -> Capabilities:
        self.capability_calls.append(model)
        return self.caps

    async def check(self, model: str | None) -> list[Check]:
        known = model is None or model in self.model_names
        return [Check(self.name, known, f"in-process fake; model {model or '-'}")]

    async def models(self) -> list[str]:
        return list(self.model_names)

    async def forget(self, conversation_id: str, session: object = None) -> None:
        """``session``: the backend session state.json names (any type: the fake keeps none)."""
        self.forgotten.append(conversation_id)

    async def aclose(self) -> None:
        self.closed = True


def install(name: str = "fake", **kw: Any) -> FakeBackend:
    """A new fake, registered as backend ``name`` like a real family (each build returns
    this same instance, so the test reads what the daemon's code did with it)."""
    fake = FakeBackend(name=name, label=name.upper(), **kw)

    def factory(settings: Settings) -> Backend:
        return fake

    backends.register(name, factory)
    return fake


_: type[Backend] = FakeBackend  # mypy: the fake keeps to the contract
