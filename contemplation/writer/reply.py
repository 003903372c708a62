"""A model reply streamed into the log as it arrives.

* :class:`ReplyStream` writes the reply's bytes: its header with the first text, stuffed
  content, the thinking section, NOTE lines, the closing markers and the commit.
* :class:`LiveReply` owns the reply's durable stream for a turn: it journals the reply's
  intent ahead of the request (:meth:`LiveReply.attempt`), holds what the server sends until
  that write is durable, takes the write back when the whole reply came first, and ends the
  reply with one commit (:meth:`LiveReply.finish`) or a marker (:meth:`LiveReply.abort`). The
  turn only reads the backend's stream and feeds it in.

Both reach the conversation's session through :class:`Session`, the part of
:class:`~contemplation.writer.session.ConvWriter` they use (so this module does not import
the session's, which makes the replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from contemplation.base.aio import settled
from contemplation.base.testing import ENABLED, crashpoint
from contemplation.errors import BackendError, ErrorKind
from contemplation.models import (
    BackendSession,
    ConvEvent,
    ErrorInfo,
    Intent,
    MarkerKind,
    Metadata,
    ReplyCut,
    ReplyEnd,
    State,
    Status,
    StreamEvent,
    Usage,
)
from contemplation.protocol import logformat
from contemplation.writer.durable import GroupCommitter, Steps, run_now
from contemplation.writer.files import now_iso, write_all

T = TypeVar("T")

#: a reply's last bytes (a held line start, the closing markers) copied into its commit's
#: record, so that recovery can finish a commit a kill cut before they were written; held
#: bytes are at most a line start being decided (4 KiB) and the markers, so this is room
TAIL_RECORDED = 64 * 1024


class Session(Protocol):
    """What a reply needs of the conversation's session (a ``ConvWriter``)."""

    state: State
    saved_intent: Intent | None
    held: list[Path]
    durable: bool

    def log_size(self) -> int: ...
    def append_fd(self) -> int: ...
    def separator(self, offset: int) -> bytes: ...
    def save(self, *, durable: bool = True) -> None: ...
    def save_steps(
        self,
        *,
        durable: bool = True,
        also: tuple[int | Path, ...] = (),
        written: Callable[[], None] | None = None,
    ) -> Steps[None]: ...
    def append_marker(self, kind: MarkerKind, text: str = "") -> None: ...
    def count_turn(self, usage: Usage | None) -> None: ...
    def marker_steps(self, kind: MarkerKind, text: str = "") -> Steps[None]: ...


class ReplyStream:
    """A model reply streamed into the log as it arrives.

    The header is written with the first text, so a call that fails before any output leaves
    no empty block. Text is stuffed line by line (see :mod:`contemplation.protocol.logformat`),
    thinking
    goes into a ``=== THINKING === … === END THINKING ===`` section.
    """

    def __init__(self, w: Session, sender: str, recipient: str, reply_id: str) -> None:
        self.w = w
        self.sender = sender
        self.recipient = recipient
        self.reply_id = reply_id
        self.started = False
        self.committed = False  # finish() wrote the commit
        self.bytes_written = 0
        self._stuffer = logformat.StreamStuffer()
        self._think_stuffer = logformat.StreamStuffer()
        self._in_thinking = False
        self._last_char = "\n"
        self._tail: list[bytes] | None = None  # the reply's last bytes, held (see finish_steps)
        self._reserved: Intent | None = None  # the intent journaled ahead (see reserve())
        self._offset = 0  # where the reply begins in the log (its separator, then its header)
        self._sha = hashlib.sha256()  # of its bytes in the log (those held excepted)
        self._unjournaled = False  # begun without a durable intent (see merge_into_commit())
        self.content_parts: list[str] = []

    def reserve(self) -> bool:
        """Put the reply's intent (its offset, before its first byte) into the next state
        write, so that the turn's first write (status, the message's commit) also journals
        the reply and :meth:`begin` needs no write of its own. The caller makes that write
        durable before any text can arrive, and calls :meth:`unreserve` on every way out
        that leaves the reply unbegun. Returns whether it reserved (False: begun already,
        or another write is in flight)."""
        if self.started or self.w.state.intent is not None:
            return False
        self._reserved = Intent(kind="reply", id=self.reply_id, offset=self.w.log_size())
        self.w.state.intent = self._reserved
        return True

    @property
    def reserved(self) -> bool:
        """begin() can use the reserved intent: it is durable and the log has not moved."""
        return self._reserved_at(self.w.log_size())

    def _reserved_at(self, offset: int) -> bool:
        intent = self._reserved
        return (
            intent is not None
            and self.w.state.intent is intent
            and (self.w.saved_intent is intent or self._unjournaled)
            and offset == intent.offset
        )

    def merge_into_commit(self, withdraw: Callable[[], bool]) -> bool:
        """The whole reply is in hand before the write that journals its intent has begun
        (a burst: the committer is busy): that write is dropped by the caller, and the reply
        is begun without a durable intent, so that its commit is the turn's one state write
        (the message's commit, the claimed file's removal and the reply's in one).

        Allowed only right after the claimed message's block, uncommitted on disk (held for
        the next state write): a crash before the commit then leaves the claimed file, its
        block and the reply's bytes right after it, which recovery marks INTERRUPTED (see
        :mod:`.recovery`) as it does a reply whose intent was journaled.

        ``withdraw`` takes the journaling write back (True) unless it has begun (False).
        Returns whether the reply will begin so; when not, nothing has changed."""
        intent = self._reserved
        if (
            self.started
            or intent is None
            or self.w.state.intent is not intent
            or self.w.saved_intent is intent
            or not self.w.held  # the claimed block, right before: nothing saved since
            or intent.offset != self.w.state.log.size  # nothing appended by hand since
            or self.w.log_size() != intent.offset
            or not withdraw()
        ):
            return False
        self._unjournaled = True
        return True

    def unreserve(self) -> None:
        """A reply that never began takes its reserved intent back, durably, before anything
        else is appended: a stale intent below a later block would read as a reply cut off
        by a crash."""
        intent, self._reserved = self._reserved, None
        if not self.started and intent is not None and self.w.state.intent is intent:
            self.w.state.intent = None
            self.w.save()

    def begin(self) -> None:
        """Journal the reply's intent (its offset) and write its header; idempotent. Called
        by the first text, or before it by a caller that does this file work off the loop.
        With a reserved intent already durable at this offset, nothing is journaled again."""
        run_now(self.begin_steps())

    def begin_steps(self) -> Steps[None]:
        """:meth:`begin` as steps (see :mod:`.durable`)."""
        if self.begin_reserved():
            return
        offset = self.w.log_size()
        self.w.state.intent = Intent(kind="reply", id=self.reply_id, offset=offset)
        yield from self.w.save_steps()
        self._start(offset)

    def begin_reserved(self) -> bool:
        """Begin now if the reserved intent is durable and the log has not moved: then only
        the header is written. False: nothing was done, :meth:`begin` must journal."""
        if self.started:
            return True
        offset = self.w.log_size()
        if not self._reserved_at(offset):
            return False
        self._start(offset)
        return True

    def _start(self, offset: int) -> None:
        prefix = self.w.separator(offset).decode()
        self._offset = offset
        self._reserved = None
        self.started = True
        self._write(prefix + logformat.header(self.sender, self.recipient))
        if ENABLED:
            crashpoint("reply_header")

    def _write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8")
        if self._tail is not None:
            self._tail.append(data)
        else:
            write_all(self.w.append_fd(), data)
            self._sha.update(data)
        self.bytes_written += len(data)
        self._last_char = text[-1]

    def _ensure_newline(self) -> None:
        if self._last_char != "\n":
            self._write("\n")

    def thinking(self, text: str) -> None:
        if not text:
            return
        if not self.started:
            self.begin()
        if not self._in_thinking:
            self._ensure_newline()
            self._write(logformat.marker(MarkerKind.THINKING))
            self._in_thinking = True
        self._write(self._think_stuffer.feed(text))

    def end_thinking(self) -> None:
        """Close the thinking section, if one is open (what follows is not thinking)."""
        if self._in_thinking:
            self._write(self._think_stuffer.flush())
            self._ensure_newline()
            self._write(logformat.marker(MarkerKind.END_THINKING))
            self._in_thinking = False

    def content(self, text: str) -> None:
        if not text:
            return
        if not self.started:
            self.begin()
        self.end_thinking()
        self.content_parts.append(text)
        self._write(self._stuffer.feed(text))
        if ENABLED:
            crashpoint("reply_stream")

    def note(self, text: str) -> None:
        """A NOTE line about how this reply is being made (e.g. a fallback backend)."""
        if self.started:
            self._ensure_newline()
            self._write(logformat.marker(MarkerKind.NOTE, text))
        else:
            self.w.append_marker(MarkerKind.NOTE, text)

    @property
    def saw_complete(self) -> bool:
        return self._stuffer.saw_complete

    def finish(
        self,
        *,
        markers: list[tuple[MarkerKind, str]] | None = None,
        usage: Usage | None = None,
        status: Status | None = None,
    ) -> int:
        """Close the block (and any markers), make it durable, and commit (with ``status``,
        decided by the caller, in the same state write). Returns bytes written."""
        return run_now(self.finish_steps(markers=markers, usage=usage, status=status))

    def finish_steps(
        self,
        *,
        markers: list[tuple[MarkerKind, str]] | None = None,
        usage: Usage | None = None,
        status: Status | None = None,
        error: ErrorInfo | None = None,
        session: BackendSession | None = None,
        cut: ReplyCut | None = None,
    ) -> Steps[int]:
        """:meth:`finish` as steps (see :mod:`.durable`).

        The reply's end is recorded before its last bytes: they are held, the commit's state
        (which counts them) is written to its temp file and made durable, by name too, and
        only then are they appended, made durable and the temp file renamed in. A crash or a
        power cut once they are in the log finds that temp file, whole and naming the log's
        very size: recovery renames it in (the reply is adopted, never asked again). The
        record also holds those last bytes and a hash of the reply's bytes before them
        (``reply_end``): a crash before they are in the log (a kill at the record's fsync)
        leaves the log short of the record by exactly them, and recovery appends them and
        renames the record in (:func:`.recovery.adopt_finished_reply`); a log that does not
        match means the reply was cut, and it is marked INTERRUPTED and redone. (Made
        durable together, a power cut between the log's fsync and the temp file's could
        keep the whole reply and lose its record: asked again.)"""
        if not self.started:
            yield from self.begin_steps()
        self._tail = []
        try:
            self.end_thinking()
            self._write(self._stuffer.flush())
            self._ensure_newline()
            for kind, text in markers or []:
                self._write(logformat.marker(kind, text))
            if self.saw_complete:
                self._write(logformat.marker(MarkerKind.COMPLETE))
        finally:
            tail, self._tail = b"".join(self._tail), None
        fd = self.w.append_fd()
        tail_written = False

        def write_tail() -> None:
            nonlocal tail_written
            write_all(fd, tail)
            tail_written = True
            crashpoint("reply_tail")  # whole in the log, its commit not yet durable

        try:
            crashpoint("reply_done")  # the reply over, its last bytes held, nothing committed
            pre = self.w.log_size()
            self.w.state.reply_end = self._end(pre, tail)
            self.w.state.intent = None
            self.w.state.turn_started = None  # the turn has ended: in the commit, no write more
            self.w.state.log.size = pre + len(tail)
            self.w.state.turns += 1
            self.w.state.last_turn = usage
            self.w.state.reply_cut = cut  # this reply's (None: it ended by itself)
            self.w.count_turn(usage)
            self.w.state.retry_count = 0
            self.w.state.next_retry_at = None
            if status is not None:
                self.w.state.status = status
            if error is not None:
                self.w.state.last_error = error
            if session is not None:  # the server-side session now holding the history
                self.w.state.backend_session = session
            # the block is durable with the state's temp file, before the state is renamed in
            yield from self.w.save_steps(also=(fd,) if self.w.durable else (), written=write_tail)
        except BaseException:
            if not tail_written and tail:  # what was said stays: a marker after it must not
                with contextlib.suppress(OSError):  # glue onto its last line
                    write_all(fd, tail)
            raise
        finally:
            self.w.state.reply_end = None  # this commit's: no later state write carries it
        self.committed = True
        return self.bytes_written

    def _end(self, pre: int, tail: bytes) -> ReplyEnd | None:
        """The record of how to finish this reply's commit (see :meth:`finish_steps`), or
        None where the log holds other bytes than the reply's since it began (nothing else
        may be appended mid-reply, but then recovery has nothing to go by) or the held
        bytes are too many to copy."""
        if pre - self._offset != self.bytes_written - len(tail) or len(tail) > TAIL_RECORDED:
            return None
        return ReplyEnd(offset=self._offset, sha256=self._sha.hexdigest(), tail=tail.decode())

    def abort(self, kind: MarkerKind, reason: str) -> None:
        """End a reply that did not finish: mark it so it is never taken for a whole answer."""
        if self.started:
            self.end_thinking()
            self._write(self._stuffer.flush())
            self._ensure_newline()
            self._write(logformat.marker(kind, reason))
            self.w.state.intent = None
            self.w.state.log.size = self.w.log_size()
            self.w.save()


_TEXT = frozenset({"content", "thinking"})
_SHOWN = {"content": ConvEvent.TOKEN, "thinking": ConvEvent.THINKING, "note": ConvEvent.NOTE}

OnEvent = Callable[[ConvEvent, str], None]  # what a reply shows as it is written


@dataclass
class Streamed:
    """What a reply's stream brought besides its text (which is already in the log)."""

    usage: Usage | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False  # cut at the reply's byte limit
    repeating: str = ""  # stopped: stuck in a loop (what repeated, for a person)
    over_time: float = 0.0  # stopped: past its time budget (the budget's seconds)
    session: BackendSession | None = None  # the server-side session now holding the history


class LiveReply:
    """A turn's reply and its durable stream (see the module's text). Made by
    ``ConvWriter.live_reply``; one turn, one reply, one or more attempts (a continuation
    with thinking off is a second attempt into the same block)."""

    def __init__(
        self,
        stream: ReplyStream,
        committer: GroupCommitter,
        *,
        meta: Metadata,
        limit: int,
        on_event: OnEvent,
    ) -> None:
        self._r = stream
        self._meta = meta
        self._committer = committer
        self.limit = limit
        self._on_event = on_event

    @property
    def meta(self) -> Metadata:
        """The conversation's metadata (its backend and model)."""
        return self._meta

    @property
    def started(self) -> bool:
        """The reply's header is in the log."""
        return self._r.started

    @property
    def committed(self) -> bool:
        return self._r.committed

    @property
    def text(self) -> str:
        """The reply's answer so far (its content, thinking left out)."""
        return "".join(self._r.content_parts)

    @property
    def saw_complete(self) -> bool:
        return self._r.saw_complete

    def content(self, text: str) -> None:
        """Text the turn adds to the answer itself (native tool calls as NEED lines)."""
        self._r.content(text)

    async def note(self, text: str) -> None:
        """A NOTE on how the reply is made. Before the reply starts it is a marker of its
        own, appended and made durable by the committer (off the loop: two fsyncs)."""
        if self._r.started:
            self._r.end_thinking()  # a NOTE goes after the thinking section, not inside it
            self._r.note(text)
        else:
            await self._committer.run(self._r.w.marker_steps(MarkerKind.NOTE, text))
        self._on_event(ConvEvent.NOTE, text)

    async def save(self) -> None:
        """The session's state, written now (not durably): it says "generating" while the
        turn does slow work before its request."""
        await self._committer.run(self._r.w.save_steps(durable=False))

    @contextlib.asynccontextmanager
    async def attempt(self) -> AsyncIterator[Feed]:
        """One request's stream into the reply. On entry the state write that says
        "generating" and journals the reply's intent is handed to the committer; the body
        feeds the server's events in (:meth:`Feed.take`). On a way out by an exception, what
        came is written (to be marked by the way out) and an intent that no text used is
        taken back, durably, before the exception goes on."""
        feed = Feed(self)
        try:
            yield feed
        except BaseException:
            await feed.close(ended=False)
            raise
        await feed.close(ended=True)

    async def finish(
        self,
        *,
        markers: list[tuple[MarkerKind, str]] | None = None,
        usage: Usage | None = None,
        status: Status | None = None,
        error: tuple[ErrorKind, str] | None = None,
        session: BackendSession | None = None,
        cut: ReplyCut | None = None,
    ) -> None:
        """Close the block and commit it, with ``status``, ``error`` (recorded, e.g. an empty
        reply) and the backend ``session`` in the same state write; its fsyncs run off the
        loop."""
        info = ErrorInfo(kind=error[0], message=error[1], time=now_iso()) if error else None
        await self._committer.run(
            self._r.finish_steps(
                markers=markers,
                usage=usage,
                status=status,
                error=info,
                session=session,
                cut=cut,
            )
        )

    def abort(self, kind: MarkerKind, reason: str) -> bool:
        """End a reply that did not finish with a marker after its text, so it is never
        taken for a whole answer. False: it had not started (nothing was written)."""
        self._r.abort(kind, reason)
        return self._r.started

    def _show(self, ev: StreamEvent) -> Usage | None:
        r = self._r
        if ev.kind == "content":
            r.content(ev.text)
        elif ev.kind == "thinking":
            r.thinking(ev.text)
        elif ev.kind == "note":
            r.note(ev.text)
        elif ev.kind == "done":
            return ev.usage
        if ev.kind in _SHOWN:
            self._on_event(_SHOWN[ev.kind], ev.text)
        return None


class Feed:
    """One request's events, applied to the reply; held in memory while the state write
    that journals the reply is not durable yet (no text may reach the log before it). The
    server's stream is still read at its pace meanwhile, so the turn lets go of its slot as
    soon as the stream ends. If the stream ends before a committer thread has begun that
    write, the write is taken back and the reply's commit does its work too (see
    :meth:`ReplyStream.merge_into_commit`): a turn in a burst makes one state write."""

    def __init__(self, live: LiveReply) -> None:
        self._live = live
        self._r = live._r
        self.got = Streamed()
        self._held: list[StreamEvent] | None = []  # None once the write is durable
        self._held_bytes = 0
        self._reserved = self._r.reserve()
        self._starting = self._r.w.save_steps(durable=self._reserved)
        self._start = asyncio.ensure_future(live._committer.run(self._starting))

    @property
    def holding(self) -> bool:
        """Events wait for the journaling write (see :meth:`durable_or`)."""
        return bool(self._held) and not self._start.done()

    async def take(self, ev: StreamEvent) -> bool:
        """Take one event (held, or applied once the write is durable); True: stop reading
        (the reply reached its byte limit)."""
        await self._release_if_durable()
        if self.got.truncated:
            return True
        if self._held is not None:
            self._held.append(ev)
            self._held_bytes += len(ev.text)
            # enough to fill the reply: stop reading; the release cuts it at the limit
            return self._held_bytes > self._live.limit
        await self._apply(ev)
        return self.got.truncated

    async def durable_or(self, nxt: asyncio.Future[Any]) -> None:
        """Wait for ``nxt`` (the next event) or the journaling write, whichever is first:
        held text goes to the log the moment the write is durable, not with the next event
        (a slow model may send that much later)."""
        await asyncio.wait([nxt, self._start], return_when=asyncio.FIRST_COMPLETED)
        await self._release_if_durable()

    async def drain(
        self,
        stream: AsyncIterator[StreamEvent],
        first: asyncio.Future[StreamEvent | None],
        *,
        stop: Callable[[StreamEvent], bool],
    ) -> None:
        """Take ``stream``'s events (its first one asked already: ``first``) until it ends,
        the reply reaches its byte limit, or ``stop`` (called after each event taken; it may
        raise) says so. While the journaling write is not durable the next event and that
        write are awaited together (:meth:`durable_or`): the server's stream is read at its
        pace, and held text reaches the log the moment the write is durable. An event still
        being asked for when this returns or raises is cancelled."""
        nxt = first
        try:
            ev = await first
            while ev is not None and not await self.take(ev):
                if stop(ev):
                    break
                if self.holding:
                    nxt = asyncio.ensure_future(anext(stream, None))
                    await self.durable_or(nxt)
                    ev = await nxt
                else:
                    ev = await anext(stream, None)
        finally:
            if not nxt.done():
                nxt.cancel()
                await asyncio.wait([nxt])

    async def close(self, *, ended: bool) -> None:
        """The stream is over (``ended``) or was left by a way out (see
        :meth:`LiveReply.attempt`)."""
        if ended and not self._start.done() and self._reserved:
            # the whole reply came while the committer was busy (a burst): its commit will
            # also do what this write was for, so a turn makes one state write, not two
            committer, starting = self._live._committer, self._starting
            self._r.merge_into_commit(lambda: committer.withdraw(starting))
        await settled(self._start)  # nothing else touches the files while it runs
        if not ended:
            if not self._start.cancelled() and self._start.exception() is None:
                # best effort: the way out's own error is the one reported
                with contextlib.suppress(OSError, BackendError):
                    await self._release()
            self._r.unreserve()  # before the way out appends its marker
            return
        self._start.result()  # a failed write raises here
        await self._release()

    async def _release_if_durable(self) -> None:
        if self._held is not None and self._start.done():
            self._start.result()  # a failed write raises here
            await self._release()

    async def _release(self) -> None:
        held, self._held = self._held or [], None
        for ev in held:
            if self.got.truncated:
                break
            await self._apply(ev)

    async def _apply(self, ev: StreamEvent) -> None:
        r, got = self._r, self.got
        if not r.started and ev.kind in _TEXT and ev.text and not r.begin_reserved():
            await self._live._committer.run(r.begin_steps())  # the intent's writes off the loop
        if ev.kind == "tool_call" and ev.tool_call is not None:
            got.calls.append(ev.tool_call)
        elif ev.kind == "session" and ev.session is not None:
            got.session = ev.session
        got.usage = self._live._show(ev) or got.usage
        got.truncated = r.bytes_written > self._live.limit
