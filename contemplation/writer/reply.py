"""A model reply streamed into the log as it arrives (see :class:`ReplyStream`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from contemplation import logformat
from contemplation.models import Intent, MarkerKind, Status, Usage
from contemplation.testing import crashpoint
from contemplation.writer.durable import Steps, run_now
from contemplation.writer.files import write_all

if TYPE_CHECKING:
    from contemplation.writer.session import ConvWriter


class ReplyStream:
    """A model reply streamed into the log as it arrives.

    The header is written with the first text, so a call that fails before any output leaves
    no empty block. Text is stuffed line by line (see :mod:`contemplation.logformat`), thinking
    goes into a ``=== THINKING === … === END THINKING ===`` section.
    """

    def __init__(self, w: ConvWriter, sender: str, recipient: str, reply_id: str) -> None:
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
        self._reserved: Intent | None = None  # the intent journaled ahead (see reserve())
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
        ``ConvWriter._recover_claimed``) as it does a reply whose intent was journaled.

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
        prefix = self.w._separator(offset).decode()
        self._reserved = None
        self.started = True
        self._write(prefix + logformat.header(self.sender, self.recipient))
        crashpoint("reply_header")

    def _write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8")
        write_all(self.w.append_fd(), data)
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

    def _end_thinking(self) -> None:
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
        self._end_thinking()
        self.content_parts.append(text)
        self._write(self._stuffer.feed(text))
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
    ) -> Steps[int]:
        """:meth:`finish` as steps (see :mod:`.durable`)."""
        if not self.started:
            yield from self.begin_steps()
        self._end_thinking()
        self._write(self._stuffer.flush())
        self._ensure_newline()
        for kind, text in markers or []:
            self._write(logformat.marker(kind, text))
        if self.saw_complete:
            self._write(logformat.marker(MarkerKind.COMPLETE))
        crashpoint("reply_done")
        fd = self.w.append_fd()
        self.w.state.intent = None
        self.w.state.log.size = self.w.log_size()
        self.w.state.turns += 1
        self.w.state.last_turn = usage
        self.w.state.retry_count = 0
        self.w.state.next_retry_at = None
        if status is not None:
            self.w.state.status = status
        # the block is durable with the state's temp file, before the state is renamed in
        yield from self.w.save_steps(also=(fd,) if self.w.durable else ())
        self.committed = True
        return self.bytes_written

    def abort(self, kind: MarkerKind, reason: str) -> None:
        """End a reply that did not finish: mark it so it is never taken for a whole answer."""
        if self.started:
            self._end_thinking()
            self._write(self._stuffer.flush())
            self._ensure_newline()
            self._write(logformat.marker(kind, reason))
            self.w.state.intent = None
            self.w.state.log.size = self.w.log_size()
            self.w.save()
