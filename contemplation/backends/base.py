"""The backend contract: one streaming call plus declared capabilities.

A backend turns a :class:`~contemplation.models.ChatRequest` into an async stream of
:class:`~contemplation.models.StreamEvent` and raises :class:`~contemplation.errors.BackendError`
(``transient`` or not) for everything that goes wrong. Timeouts are the backend's job because
only it knows the phases of its protocol (connect, first byte, idle between chunks, total).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from contemplation.errors import BackendError, ErrorKind
from contemplation.models import BackendSession, ChatRequest, StreamEvent

if TYPE_CHECKING:
    from contemplation.backends.http import Stream
    from contemplation.settings import TimeoutSettings


@dataclass(frozen=True, slots=True)
class Capabilities:
    thinking: bool = False
    tools: bool = False
    vision: bool = False
    context_length: int | None = None  # what the model can hold (allocated, else trained)
    source: str = "default"  # "server", "family table", "config", "default"
    request_window: int | None = None  # what each request is given, when the backend sets it
    # (Ollama's num_ctx, always sent: Ollama otherwise truncates silently)
    cannot_chat: str = ""  # what the server says the model is instead of one that chats
    # (Ollama's capabilities without "completion": "embedding", "decision"); "": it chats


@dataclass(frozen=True, slots=True)
class Check:
    """One line of ``contemplation doctor``."""

    name: str
    ok: bool
    detail: str
    hints: tuple[str, ...] = field(default=())
    warn: bool = False  # ok, but worth acting on: doctor's "warn" (the hints say how)


@runtime_checkable
class Backend(Protocol):
    name: str
    label: str  # the model-side label in messages.log (OLLAMA, OPENAI, ...)
    concurrency: int

    def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]: ...

    async def capabilities(self, model: str) -> Capabilities: ...

    async def check(self, model: str | None) -> list[Check]: ...

    async def models(self) -> list[str]:
        """The model names the server offers (``contemplation models``); a server that
        cannot be asked raises BackendError, one that does not say returns []."""
        ...

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        """Drop server-side state kept for a conversation (called when it is archived);
        ``session`` is the one its state.json names, known even after a restart. Never raises
        for a server that fails: the failure is logged."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Slots:
    """How many turns a server takes at once, and where that figure came from."""

    count: int
    source: str  # "config", "server /props", "server /slots", "n_parallel", "default ..."
    # the server also runs different models side by side by itself (Ollama): a panel's
    # seats on different models go out together (engine/scheduler.py's side slots)
    models_at_once: bool = False


@runtime_checkable
class KnowsLimits(Protocol):
    """A backend that can ask its server for its own limits (slots; the window is part of
    :meth:`Backend.capabilities`). ``stale`` forgets what was asked: the server restarted."""

    async def slots(self) -> Slots: ...

    def stale(self) -> None: ...


@runtime_checkable
class CountsTokens(Protocol):
    """A backend whose server has a tokenizer (llama-server ``POST /tokenize``)."""

    async def count_tokens(self, text: str, *, within: float) -> int | None:
        """How many tokens the server's tokenizer makes of ``text``, asked once within
        ``within`` s; None when it cannot say (no such endpoint, an error, too slow)."""
        ...


@dataclass(frozen=True, slots=True)
class PhaseTimeouts:
    """The phases of one streamed reply, and the longest line a server may send in it."""

    connect: float
    first_byte: float
    idle: float
    total: float
    max_line: int = 4 * 1024 * 1024  # max_reply_bytes: a line never grows past it


def phase_timeouts(t: TimeoutSettings, max_line: int = 4 * 1024 * 1024) -> PhaseTimeouts:
    """A kind's ``timeouts`` table as the phases of one reply."""
    return PhaseTimeouts(
        connect=t.connect, first_byte=t.first_byte, idle=t.idle, total=t.total, max_line=max_line
    )


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def json_object(text: str, source: str) -> dict[str, Any]:
    """One JSON object from a stream line or event; anything else is a transient protocol error."""
    try:
        data = json.loads(text)
    except ValueError:
        raise BackendError(
            f"{source} sent something that is not JSON: {text[:200]!r}",
            transient=True,
            kind=ErrorKind.PROTOCOL,
        ) from None
    if not isinstance(data, dict):
        raise BackendError(f"{source} sent {text[:200]!r}", transient=True, kind=ErrorKind.PROTOCOL)
    return data


class Merged:
    """Runs of text events (content, or thinking) that came in one read of the stream, as one
    event each. A server faster than the daemon (a GPU's) sends many tokens per read; each event
    costs the turn a pass of its loop and the log a write, so without this the daemon, not the
    server, sets the pace (bench/bench_ingest.py). When the daemon keeps up, a read holds one
    token and nothing waits: :meth:`flush` is called whenever no more is buffered."""

    # characters in one merged event (about 250 tokens; at most 4 KiB of UTF-8): a flood still
    # goes out in pieces, and a reply cut at max_reply_bytes overshoots by less than one
    LIMIT = 1024

    def __init__(self) -> None:
        self._kind: Literal["content", "thinking"] | None = None
        self._parts: list[str] = []
        self._size = 0

    def add(self, events: Iterable[StreamEvent]) -> list[StreamEvent]:
        """What may go on now: all but a text run that may still grow."""
        out: list[StreamEvent] = []
        for ev in events:
            if ev.kind in ("content", "thinking") and ev.text:
                if ev.kind != self._kind or self._size >= self.LIMIT:
                    out += self.flush()
                    self._kind = ev.kind
                self._parts.append(ev.text)
                self._size += len(ev.text)
            else:
                out += self.flush()
                out.append(ev)
        return out

    def take(self, events: Iterable[StreamEvent], *, more: bool) -> list[StreamEvent]:
        """:meth:`add`, and what is held too unless ``more`` of the read is buffered."""
        out = self.add(events)
        return out if more else out + self.flush()

    def flush(self) -> list[StreamEvent]:
        if self._kind is None:
            return []
        ev = StreamEvent(kind=self._kind, text="".join(self._parts))
        self._kind, self._parts, self._size = None, [], 0
        return [ev]


class TimedLines:
    """The lines of a streamed body, under the phase timeouts and a cap on a line's length.

    ``first_byte`` applies until the caller reports :meth:`progress`, then ``idle`` between
    two progress reports (a keep-alive ping is a line but not progress), and ``total`` caps
    the whole reply. A line longer than ``max_line`` bytes fails the turn at once instead of
    growing in memory: a server that never sends a newline cannot exhaust it.
    """

    def __init__(self, resp: Stream, t: PhaseTimeouts, what: str, *, t0: float) -> None:
        self._chunks = resp.chunks(what)
        self._buf = bytearray()
        self._pos = 0  # start of the first unread line in _buf
        self._eof = False
        self.t = t
        self.what = what
        self.deadline = t0 + t.total
        self.last_progress = t0
        self.started = False

    def progress(self) -> None:
        self.started = True
        self.last_progress = time.monotonic()

    @property
    def ready(self) -> bool:
        """A whole line is buffered: :meth:`next` returns it without waiting for the server."""
        return self._buf.find(b"\n", self._pos) >= 0

    async def next(self) -> str | None:
        """The next line (without its end), or None at the end of the body."""
        end = self._buf.find(b"\n", self._pos)
        if end >= 0:  # already here: no timer to arm (a fast server sends many lines a read)
            return self._take(end, end + 1)
        limit = self.t.idle if self.started else self.t.first_byte
        now = time.monotonic()
        wait = min(self.last_progress + limit, self.deadline) - now
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                return await self._line()
        except TimeoutError:
            if time.monotonic() >= self.deadline - 0.001:
                raise BackendError(
                    f"the reply took longer than the total cap of {self.t.total:g} s",
                    transient=True,
                    kind=ErrorKind.TIMEOUT,
                ) from None
            raise BackendError(
                f"{self.what}: no data for {limit:g} s (stalled)",
                transient=True,
                kind=ErrorKind.STALL,
            ) from None

    async def _line(self) -> str | None:
        while True:
            end = self._buf.find(b"\n", self._pos)
            if end >= 0:
                return self._take(end, end + 1)
            if len(self._buf) - self._pos > self.t.max_line:
                raise BackendError(
                    f"{self.what} sent a line longer than {self.t.max_line} bytes "
                    "(max_reply_bytes) without a newline; the reply was dropped",
                    transient=False,
                    kind=ErrorKind.TOO_LARGE,
                )
            if self._eof:
                end = len(self._buf)
                return self._take(end, end) if self._pos < end else None
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            chunk = await anext(self._chunks, None)
            if chunk is None:
                self._eof = True
            else:
                self._buf += chunk

    def _take(self, end: int, after: int) -> str:
        line = self._buf[self._pos : end].decode("utf-8", errors="replace")
        self._pos = after
        return line[:-1] if line.endswith("\r") else line

    async def drain(self, wait_s: float = 1.0) -> None:
        """Read what is left of a finished reply (normally only the end of the chunked body)
        so the keep-alive connection goes back to the pool instead of being closed: without
        it every turn opened a new TCP connection. Gives up quickly; closing is always safe."""
        with contextlib.suppress(TimeoutError, BackendError):
            async with asyncio.timeout(wait_s):
                async for _ in self._chunks:
                    pass
