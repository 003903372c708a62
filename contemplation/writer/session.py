"""A locked session on one conversation: appends, state and rotation.

Every change to ``messages.log`` and ``state.json`` happens in a :class:`ConvWriter` opened by
:func:`open_writer`, i.e. while holding ``flock(<conv>/.lock)``. What the writes leave for a
crash to interrupt (claimed files, intents, a rotation) is finished or undone by
:func:`contemplation.writer.recovery.recover` at the conversation's first step.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.base.privacy import FILE_MODE
from contemplation.base.testing import ENABLED, armed, crashpoint
from contemplation.errors import ErrorKind, InputRejected, LockBusy, NotFound
from contemplation.models import (
    ApprovalRequest,
    ErrorInfo,
    Intent,
    LogIdentity,
    MarkerKind,
    Metadata,
    Rotation,
    State,
    Status,
    TurnStarted,
    Usage,
)
from contemplation.protocol import ledger, logformat
from contemplation.store import logstream
from contemplation.store.cursors import own_block
from contemplation.store.layout import (
    Conv,
    Seen,
    list_folder,
    open_regular_stat,
    processing_entries,
    read_json_why,
    read_metadata,
    read_state,
)
from contemplation.store.logview import log_segments
from contemplation.writer.durable import Durable, GroupCommitter, Steps, run_now
from contemplation.writer.files import (
    atomic_write_steps,
    conv_lock,
    fsync_dir,
    now_iso,
    write_all,
)
from contemplation.writer.folders import (
    adopt_folder,
    claim_link,
    finish_claims,
    release_claimed,
)
from contemplation.writer.reply import LiveReply, OnEvent, ReplyStream

DONE_IDS_KEPT = 64  # only a crash between commit and unlink needs them (see recover)
PENDING_NEEDS_KEPT = 50  # state.json shows the first ones; the log holds them all
PARSE_ERRORS_KEPT = 20


# --------------------------------------------------------------------------- the session


def remove_claimed(path: Path) -> None:
    """A claimed message whose block is committed: a file, or a folder with files (its
    copies are in attachments/ already)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class Taken:
    """A held message's block (where it starts, its length) and its file as it was read
    (None: a folder message)."""

    offset: int
    length: int
    seen: Seen | None


@dataclass(frozen=True, slots=True)
class Kept:
    """What :meth:`ConvWriter.keep_log` found and did."""

    settling_until: float | None = None  # bytes appended by hand still settling: look then
    adopted: int = 0  # bytes appended by hand, now the log's
    rotated: bool = False
    stat: os.stat_result | None = None  # the log's, when nothing changed it since the look


@dataclass
class ConvWriter:
    """Writes to one conversation while its lock is held (see :func:`open_writer`)."""

    conv: Conv
    meta: Metadata
    state: State
    durable: bool = True
    rebuilt: bool = False  # state.json was lost and derived from the log
    warnings: list[str] = field(default_factory=list)
    unsaved: bool = False  # a commit held in memory, written by the next save or flush()
    held: list[Path] = field(default_factory=list)  # claimed files whose block awaits its fsync
    # claims linked and not yet durable, (inbox name, processing/ name): see claim()
    claiming: list[tuple[Path, Path]] = field(default_factory=list)
    taken: dict[Path, Taken] = field(default_factory=dict)  # held files' blocks, as read
    saved_intent: Intent | None = None  # the intent the last durable state write carried
    fd: int | None = None  # messages.log, read-write in append mode, open for this session
    queue: list[Path] | None = None  # processing/, listed once a session (see claimed_files)
    listing: list[str] | None = None  # the folder, listed once a session (see folder_names)
    meta_unsaved: bool = False  # a folder made by hand: metadata.json is written by the next save
    folder_unsynced: bool = False  # ... and the next durable point makes its new names durable
    log_stat: os.stat_result | None = None  # the log by name, as check_identity() found it

    def claimed_files(self) -> list[Path]:
        """The files waiting in ``processing/``, oldest first. Listed once a session: only
        the holder of the lock claims a file into it or removes one, so the list stays true
        while this writer lives, once :meth:`took` is told of each file taken."""
        if self.queue is None:
            self.queue = processing_entries(self.conv)
        return self.queue

    def folder_names(self) -> list[str]:
        """The names in the conversation's folder, listed once a session and shared by what
        needs them at first sight (recovery's stale temp files, the log's segments): only the
        lock holder rotates the log (a rotation lists again)."""
        if self.listing is None:
            self.listing = list_folder(self.conv)
        return self.listing

    def claim(self, inbox_file: Path) -> Path | None:
        """Take an inbox file into ``processing/`` by a link alone, on this thread and with no
        fsync: the claim is made durable (``processing/`` fsynced, then the inbox name
        removed) by the next state write, which the message's request does not wait for
        (the reply's first one, see :class:`~.reply.Feed`), before that write counts its
        block (see :meth:`save_steps`). Until then the file has both names, and a crash
        leaves both: recovery keeps the claim (``drop_claimed_twins``). None: not linked
        (see :func:`~.folders.claim_link`): take it with :func:`~.folders.claim`."""
        claimed = claim_link(self.conv, inbox_file) if self.durable else None
        if claimed is not None:
            self.claiming.append((inbox_file, claimed))
        return claimed

    def claim_steps(self) -> Steps[None]:
        """The claims linked since the last state write, made durable (see :meth:`claim`);
        kept until they are, so a write that failed makes them again."""
        if not self.claiming:
            return
        linked = list(self.claiming)
        yield from finish_claims(self.conv, linked, durable=self.durable)
        del self.claiming[: len(linked)]

    def claims_durable(self) -> None:
        """:meth:`claim_steps` here and now: a claimed file that will not be appended (refused,
        put back, removed) goes only once its claim is durable."""
        run_now(self.claim_steps())

    def took(self, path: Path) -> None:
        """``path`` left the queue (appended, refused, or gone)."""
        if self.queue is not None and path in self.queue:
            self.queue.remove(path)

    def close(self) -> None:
        """Let go of messages.log (the session's end, a rotation, a log that was replaced)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def append_fd(self) -> int:
        """The session's descriptor on messages.log (opened on first use, never through a
        link): every append of this session and the reply's text go through it."""
        if self.fd is None:
            self.fd = os.open(
                self.conv.log,
                os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                FILE_MODE,
            )
        return self.fd

    # -- state ------------------------------------------------------------------------

    def save(self, *, durable: bool = True) -> None:
        """Write state.json atomically; ``durable=False`` skips fsync for informational changes
        (a status) that are rebuilt from the log after a power loss anyway.

        Blocks held by :meth:`append_block` are made durable first (no state that counts a
        block is written before the block is durable), and their claimed files removed after."""
        run_now(self.save_steps(durable=durable))

    def save_steps(
        self,
        *,
        durable: bool = True,
        also: tuple[int | Path, ...] = (),
        written: Callable[[], None] | None = None,
    ) -> Steps[None]:
        """:meth:`save` as steps (see :mod:`.durable`), for a group committer to drive.
        ``also``: files that must be durable before this state is (a reply's block);
        ``written``: called once the state's temp file is written, before any fsync (see
        :func:`.files.atomic_write_steps`)."""
        # the claims first: nothing counts a claimed block before its claim is durable
        yield from self.claim_steps()
        sync_state = self.durable and durable
        log = self.fd if self.fd is not None else self.conv.log
        before = (*also, log) if self.held and self.durable else also
        folder = (self.conv.dir,) if self.folder_unsynced and self.durable else ()
        # a claim's unlink from inbox/ is as durable as the block the commit counts, before
        # its processing/ name goes: else a power cut brings a message answered back into
        # inbox/ (its processing/ name was made durable by the claim: see folders.claim)
        claims = (self.conv.inbox,) if self.held and self.durable else ()
        # the log, the temp file and the folder are on the folder's file system
        dev = self.log_stat.st_dev if self.log_stat is not None else None
        if self.meta_unsaved:  # rebuilt alike from the defaults if a power loss takes it
            yield from atomic_write_steps(self.conv.metadata, _file(self.meta), durable=False)
            self.meta_unsaved = False
        if before and not sync_state:
            yield Durable(files=before, folders=(*folder, *claims), dev=dev)
            folder = ()
        self.state.updated = now_iso()
        steps = atomic_write_steps(
            self.conv.state, _file(self.state), durable=sync_state, dev=dev, written=written
        )
        if sync_state and before:  # those files and the temp file in one point
            if written is not None:  # a reply's commit: its temp file, the record of the
                yield next(steps)  # reply's end, by name, before the last bytes are written
            first = next(steps)
            yield Durable(files=(*before, *first.files), folders=(*first.folders, *claims), dev=dev)
        yield from steps
        if sync_state or not folder:  # a durable state write ends with this folder's fsync
            self.folder_unsynced = False
        if durable or not self.durable:  # as safe as this writer's durability allows
            self.saved_intent = self.state.intent
        self.unsaved = False
        held, self.held = self.held, []
        for path in held:  # the block is durable and committed: the record is done with
            self._release(path)

    def _release(self, path: Path) -> None:
        """A claimed message whose block is committed goes; a write that landed in its file
        since it was read is queued as a follow-up (never dropped)."""
        taken = self.taken.pop(path, None)
        if taken is None or taken.seen is None:
            remove_claimed(path)
            return
        rest = release_claimed(self.conv, path, taken.seen, durable=self.durable)
        if rest is not None:
            self.warn(
                f"{path.name.split('-', 2)[-1]} was written into after it was taken: "
                f"queued as inbox/{rest.name}"
            )

    def changed_held(self) -> list[Path]:
        """Held message files (their blocks not committed yet) that are not as they were
        read: a write landed in them since."""
        out: list[Path] = []
        for path in self.held:
            seen = t.seen if (t := self.taken.get(path)) is not None else None
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if seen is not None and (st.st_size, st.st_mtime_ns) != (seen.size, seen.mtime_ns):
                out.append(path)
        return out

    def retake(self, path: Path, text: str, seen: Seen) -> bool:
        """Write a held message's block again with ``text``, what its file holds now (a
        write landed in it before its turn began): the same message, whole. Only while it is
        the log's last block and uncommitted on disk (held: no state written since); the
        claimed file still matches the block, so recovery finds it as ever. False: left as
        it is (the release queues the rest)."""
        t = self.taken.get(path)
        if t is None or path not in self.held or self.log_size() != t.offset + t.length:
            return False
        data = self.block_bytes(self.meta.agent_label, self.meta.sender_label(), text, t.offset)
        if len(data) <= t.length:  # not grown: the parse of the log would not see a change
            return False
        self.rollback(t.offset)
        self._append_raw(data, sync=False)
        self.state.log.size = t.offset + len(data)
        self.taken[path] = Taken(t.offset, len(data), seen)
        return True

    def mark_log_start(self) -> None:
        """Write state.json now, not durably, with the log as it is: a folder made by hand,
        before anything is appended to its log. A crash in its first append then finds the
        size the block started at, so recovery takes a whole block once and cuts a torn one
        (without it, the state rebuilt from the log would count the torn or uncommitted block
        and the claimed message would be appended again)."""
        run_now(atomic_write_steps(self.conv.state, _file(self.state), durable=False))

    def flush(self) -> None:
        """Write a commit held in memory (see :meth:`append_block`)."""
        if self.unsaved or self.held or self.claiming:
            self.save(durable=False)

    # -- state transitions: nothing outside the writer assigns the state's fields -------

    def set_status(self, status: Status, *, save: bool = True) -> None:
        self.state.status = status
        if save:
            self.save()

    def show(self, status: Status, needs: tuple[str, ...] = ()) -> None:
        """Say what the conversation waits for (and the needs it waits on): written, not
        durably, when it changed (a status is rebuilt from the log after a power loss)."""
        shown = list(needs[:PENDING_NEEDS_KEPT])
        if self.state.status != status or shown != self.state.pending_needs:
            self.state.status = status
            self.state.pending_needs = shown
            self.save(durable=False)

    def read_for_model(self, size: int) -> None:
        """``size`` bytes the daemon read for the model (a need's answer, the context), never
        in the agent's context: counted in the ledger with the next turn (saved with the
        next state write; negative: taken back, before that write)."""
        book = self.state.ledger
        book.unturned_bytes = max(0, book.unturned_bytes + size)

    def context_read(self, size: int) -> None:
        """The first turn's context sections (``size`` bytes) in its ledger line: set, not
        added, so a turn begun again counts them once."""
        self.state.ledger.unturned_bytes = max(0, size)

    def count_turn(self, usage: Usage | None) -> None:
        """The turn that ends in the ledger (in the state the reply's commit writes)."""
        book = self.state.ledger
        line = ledger.entry(
            usage,
            turn=self.state.turns,
            provider=self.meta.backend,
            model=self.meta.model,
            context_bytes=book.unturned_bytes,
        )
        ledger.record(book, line)
        book.unturned_bytes = 0

    def count_summary(self, usage: Usage, *, provider: str, model: str) -> None:
        """A compaction's summary call, a row of its own in the ledger (cause "compaction",
        no turn): counted with the turn it was made for, saved with the next state write."""
        line = ledger.entry(
            usage, turn=self.state.turns + 1, provider=provider, model=model, turns=0,
            miss="compaction",
        )  # fmt: skip
        ledger.record(self.state.ledger, line)

    def generating(self, since: float) -> None:
        """A turn holds a slot since ``since`` (a monotonic time): written by the reply's
        first state write (see :meth:`LiveReply.attempt`)."""
        self.state.generating_since = since
        self.state.status = Status.GENERATING
        self.state.pending_needs = []

    def retry_at(
        self,
        at: float,
        *,
        settings: str,
        kind: ErrorKind,
        message: str,
        attempt: int | None = None,
    ) -> None:
        """The turn is redone at ``at`` (a monotonic time), unless the backend's settings
        (``settings``, their fingerprint) change first; ``attempt``: the failed attempts."""
        if attempt is not None:
            self.state.retry_count = attempt
        self.state.next_retry_at = at
        self.state.retry_settings = settings
        self.record_error(kind, message, status=Status.RETRYING)

    def begin_turn(self, run: str) -> TurnStarted:
        """A turn's request is about to go out in the run ``run``: recorded as begun by one
        more run when another run began the same turn and never ended it, else as begun
        once. Kept in memory: the turn's first state write carries it (or the caller's)."""
        key = (self.state.turns, self.state.messages_processed)
        before = self.state.turn_started
        starts = 1
        if before is not None and (before.turns, before.messages) == key:
            starts = before.starts + (before.run != run)
        self.state.turn_started = TurnStarted(turns=key[0], messages=key[1], run=run, starts=starts)
        return self.state.turn_started

    def end_turn(self) -> None:
        """The turn ended, however (a reply, an error, a retry, a cancel, a stop): its record
        goes with the next state write (a reply's commit takes it itself)."""
        if self.state.turn_started is not None:
            self.state.turn_started = None
            self.unsaved = True

    def gave_up(self, kind: ErrorKind, message: str) -> None:
        """The turn failed for good: the error stands until the agent says something."""
        self.state.retry_count = 0
        self.state.next_retry_at = None
        self.record_error(kind, message, status=Status.ERROR)

    def record_error(self, kind: ErrorKind, message: str, *, status: Status = Status.ERROR) -> None:
        self.state.last_error = ErrorInfo(kind=kind, message=message, time=now_iso())
        self.state.status = status
        self.state.turn_started = None  # a turn that failed (retried or not) has ended
        self.save()

    def record_parse_errors(self, errors: list[str]) -> None:
        """The log's parse errors (the first ones), written when they changed."""
        kept = errors[:PARSE_ERRORS_KEPT]
        if kept != self.state.parse_errors:
            self.state.parse_errors = kept
            self.save()

    def record_asked(self, asked: tuple[ApprovalRequest, ...]) -> bool:
        """Keep the pending approval requests (a request keeps the time it was first asked).
        True when there is a request that was not pending before.

        Kept in memory: they reach state.json in the same write as the status that says what
        they mean (the step's next :meth:`show`, else :meth:`flush` as the lock goes). Written
        on their own, a state would ask for no lookup while it still said the conversation
        waits for approval, and a face would show a lookup just approved as a need."""
        before = {r.id: r for r in self.state.pending_approvals}
        now = [
            r.model_copy(update={"asked": before[r.id].asked if r.id in before else now_iso()})
            for r in asked
        ]
        if now == self.state.pending_approvals:
            return False
        self.state.pending_approvals = now
        self.unsaved = True
        return any(r.id not in before for r in now)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.state.warnings = ([*self.state.warnings, text])[-20:]

    # -- the log ------------------------------------------------------------------------

    def log_size(self) -> int:
        """The log's size: through the session's descriptor once it is open (the file every
        append of this session goes to), else by name (0 if there is none yet)."""
        if self.fd is not None:
            return os.fstat(self.fd).st_size
        try:
            st = os.stat(self.conv.log, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        return st.st_size

    def check_identity(self) -> int:
        """Compare the log with what state.json accounted for; return the foreign byte count.

        A replaced file (new inode: an editor saved it) or a shrunk one (truncated by hand) is
        re-baselined with a warning: offsets recorded before that point are not trusted.
        The stat it takes is kept in :attr:`log_stat` (the log as it is now, by name).
        """
        self.log_stat = None
        try:
            st = os.stat(self.conv.log, follow_symlinks=False)
        except FileNotFoundError:
            self.close()
            fd = os.open(
                self.conv.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE
            )
            os.close(fd)
            st = os.stat(self.conv.log)
            if self.state.log.size:
                self.warn("messages.log was deleted; started a new one")
            self.state.log = LogIdentity(ino=st.st_ino, size=0)
            self.save()
            self.log_stat = st
            return 0
        if not stat.S_ISREG(st.st_mode):
            raise InputRejected(
                f"{self.conv.log} is not a regular file (a symlink?); refusing to write through it"
            )
        self.log_stat = st
        ident = self.state.log
        if self.fd is not None and os.fstat(self.fd).st_ino != st.st_ino:
            self.close()  # the name now points at another file
        if ident.ino and st.st_ino != ident.ino:
            self.warn("messages.log was replaced (new inode); re-read it whole")
            self.state.log = LogIdentity(ino=st.st_ino, size=st.st_size)
            self.save()
            return 0
        if st.st_size < ident.size:
            self.warn(
                f"messages.log shrank from {ident.size} to {st.st_size} bytes; re-read it whole"
            )
            self.state.log = LogIdentity(ino=st.st_ino, size=st.st_size)
            self.save()
            return 0
        if not ident.ino:
            self.state.log.ino = st.st_ino
        return st.st_size - ident.size

    def keep_log(self, now: float, settle: float, rotate_bytes: int) -> Kept:
        """The log kept whole between blocks, in one look: its identity checked
        (:meth:`check_identity`), bytes appended by hand adopted once they have been still
        for ``settle`` seconds by the wall clock ``now`` (:meth:`adopt_foreign`), then a log
        of ``rotate_bytes`` or more rotated (:meth:`maybe_rotate`)."""
        foreign = self.check_identity()
        st = self.log_stat
        adopted = 0
        if foreign > 0:
            mtime = (st or os.stat(self.conv.log)).st_mtime_ns / 1e9
            if now - mtime < settle:
                return Kept(settling_until=mtime + settle)
            adopted = self.adopt_foreign()
            st = None
        rotated = self.maybe_rotate(rotate_bytes, st.st_size if st else None)
        return Kept(adopted=adopted, rotated=rotated, stat=None if rotated else st)

    def adopt_foreign(self) -> int:
        """Account for bytes someone appended by hand (they stay in the log as written)."""
        size = self.log_size()
        n = size - self.state.log.size
        if n > 0:
            self.state.log.size = size
            self.save()
        return n

    def _append_raw(self, data: bytes, *, sync: bool) -> None:
        fd = self.append_fd()
        write_all(fd, data)
        if sync and self.durable:
            os.fsync(fd)

    def rollback(self, offset: int) -> None:
        """Cut the log back to ``offset`` (never through a symlink)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.conv.log, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, offset)
            finally:
                os.close(fd)

    def block_bytes(
        self,
        sender: str,
        recipient: str,
        text: str,
        offset: int,
        *,
        ts: str | None = None,
        own: tuple[int, ...] = (),
    ) -> bytes:
        """The bytes of an agent's block appended at ``offset`` (the separator included);
        ``own``: its lines that are the writer's ``[attachment: …]`` lines, every other line
        so shaped is stuffed (see :func:`contemplation.protocol.logformat.inert`)."""
        block = logformat.header(sender, recipient, ts) + logformat.body(text, own)
        return self.separator(offset) + block.encode("utf-8")

    def append_block(
        self,
        sender: str,
        recipient: str,
        text: str,
        *,
        msg_id: str,
        claimed: Path | None = None,
        seen: Seen | None = None,
        own: tuple[int, ...] = (),
    ) -> int:
        """Append one whole block exactly once (write, fsync, commit). Returns its offset.

        ``claimed``: the block is the agent message in that file (``processing/<msg_id>``),
        the record of the write until the commit (recovery recognises the block from it). So
        no intent is journaled, and the fsync, the commit and the file's removal are held for
        the next state write (the turn's, which runs on a worker thread while the request is
        sent, or :meth:`flush` when the lock is let go): the block is fsynced before any state
        that counts it, and the file removed after. A crash before that finds the file and
        the block, whole or torn, and takes it exactly once. Any other block (an answer to a
        need) journals an intent (offset, length, sha256) first. ``seen``: the claimed file
        as it was read, checked again before it is removed (see :meth:`_release`). ``own``:
        see :meth:`block_bytes`."""
        if msg_id in self.state.done_ids:
            return -1
        self.append_fd()  # the size and the separator are read through it
        offset = self.log_size()
        data = self.block_bytes(sender, recipient, text, offset, own=own)
        if claimed is None:
            self.state.intent = Intent(
                kind="message",
                id=msg_id,
                offset=offset,
                length=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )
            self.save()
        if ENABLED:
            crashpoint("intent")
        try:
            if ENABLED and armed("append"):
                self._append_raw(data[: len(data) // 2], sync=False)
                crashpoint("append")
                self._append_raw(data[len(data) // 2 :], sync=claimed is None)
            else:
                self._append_raw(data, sync=claimed is None)
        except OSError:
            self.rollback(offset)
            if claimed is None:
                self.state.intent = None
                with contextlib.suppress(OSError):
                    self.save()
            raise
        if ENABLED:
            crashpoint("appended")
        if claimed is not None:
            self.held.append(claimed)
            self.taken[claimed] = Taken(offset, len(data), seen)
        self.commit_message(msg_id, offset + len(data), save=claimed is None)
        return offset

    def separator(self, offset: int) -> bytes:
        """A blank line before a new header (as in the documented format)."""
        if offset == 0:
            return b""
        return b"\n" if self._ends_with_newline(offset) else b"\n\n"

    def _ends_with_newline(self, size: int) -> bool:
        return os.pread(self.append_fd(), 1, size - 1) == b"\n"

    def commit_message(self, msg_id: str, end: int, *, save: bool = True) -> None:
        self.state.intent = None
        self.state.log.size = end
        self.state.done_ids = [*self.state.done_ids, msg_id][-DONE_IDS_KEPT:]
        self.state.messages_processed += 1
        self.state.retry_count = 0  # a new message from the agent resets any backoff
        self.state.next_retry_at = None
        # No fsync needed here: the block is already durable (a held one is fsynced by save()
        # before this commit is written), so after a power loss recovery finds it whole (from
        # its intent, its claimed file, or as bytes to adopt).
        if save:
            self.save(durable=False)
        else:
            self.unsaved = True
        if ENABLED:
            crashpoint("commit")

    def append_marker(self, kind: MarkerKind, text: str = "") -> None:
        run_now(self.marker_steps(kind, text))

    def marker_steps(self, kind: MarkerKind, text: str = "") -> Steps[None]:
        """:meth:`append_marker` as steps (see :mod:`.durable`), for a group committer to
        drive: the marker is written, made durable with the state write that counts it, and
        committed. Nothing is written before the steps are first advanced."""
        fd = self.append_fd()
        offset = self.log_size()
        data = logformat.marker(kind, text).encode("utf-8")
        if offset and not self._ends_with_newline(offset):
            data = b"\n" + data
        self._append_raw(data, sync=False)
        self.state.log.size = offset + len(data)
        yield from self.save_steps(also=(fd,) if self.durable else ())

    def reply(self, sender: str, recipient: str, reply_id: str) -> ReplyStream:
        """A reply written here and now (each durable point fsync'ed on this thread)."""
        return ReplyStream(self, sender, recipient, reply_id)

    def live_reply(
        self, committer: GroupCommitter, *, limit: int, on_event: OnEvent, reply_id: str = ""
    ) -> LiveReply:
        """The turn's reply (see :class:`LiveReply`), after the log's end; its durable
        writes are driven by ``committer``."""
        stream = ReplyStream(
            self,
            self.meta.sender_label(),
            self.meta.agent_label,
            reply_id or f"reply-{self.state.log.size}",
        )
        return LiveReply(stream, committer, meta=self.meta, limit=limit, on_event=on_event)

    # -- rotation -----------------------------------------------------------------------

    def maybe_rotate(self, limit: int, size: int | None = None) -> bool:
        """Rotate ``messages.log`` once it is ``limit`` bytes or more. Call it between blocks:
        it does nothing while a write is in flight or foreign bytes are not yet adopted.
        ``size``: the log's size if the caller has just taken it."""
        size = self.log_size() if size is None else size
        if size < limit or self.state.intent is not None or size != self.state.log.size:
            return False
        self.rotate()
        return True

    def rotate(self) -> None:
        """``messages.N.log`` → ``N+1`` (highest first), ``messages.log`` → ``messages.1.log``,
        then a new ``messages.log``. Renames only, so ``tail -F`` follows it. Journaled in
        state.json first; :meth:`recover` completes a rotation a crash interrupted."""
        segs = [p.name for p in log_segments(self.conv)[:-1]]
        top = max((int(n.split(".")[1]) for n in segs), default=0)
        self.state.rotation = Rotation(segments=top, ino=os.stat(self.conv.log).st_ino)
        self.save()
        crashpoint("rotate")
        self.complete_rotation()

    def complete_rotation(self) -> str:
        rot = self.state.rotation
        if rot is None:
            return ""
        self.close()  # the live log is about to become messages.1.log
        self.listing = None
        d = self.conv.dir
        for n in range(rot.segments, 0, -1):
            src, dst = d / f"messages.{n}.log", d / f"messages.{n + 1}.log"
            if src.exists() and not dst.exists():
                os.rename(src, dst)
        first = d / "messages.1.log"
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.conv.log).st_ino == rot.ino and not first.exists():
                os.rename(self.conv.log, first)
                crashpoint("rotate_renamed")
        try:
            fd = os.open(
                self.conv.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE
            )
        except FileExistsError:
            pass
        else:
            try:
                note = "earlier blocks are in messages.1.log, messages.2.log, … (higher is older)"
                write_all(fd, logformat.marker(MarkerKind.CONTINUED, note).encode())
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        if self.durable:
            fsync_dir(d)
        st = os.stat(self.conv.log)
        self.state.log = LogIdentity(ino=st.st_ino, size=st.st_size)
        self.state.rotation = None
        self.save()
        return f"rotated messages.log into messages.1.log ({rot.segments + 1} segments)"

    def log_bytes(self, offset: int, n: int) -> bytes:
        """At most ``n`` bytes of messages.log from ``offset`` (recovery's look at the log)."""
        with open(self.conv.log, "rb") as f:
            f.seek(offset)
            return f.read(n)


def _file(model: Metadata | State) -> bytes:
    """metadata.json's or state.json's bytes."""
    return model.model_dump_json(indent=2).encode() + b"\n"


@contextlib.contextmanager
def open_writer(
    conv: Conv,
    *,
    durable: bool = True,
    default_meta: Metadata | Callable[[], Metadata] | None = None,
    wait: bool = True,
) -> Iterator[ConvWriter]:
    """Lock the conversation, load (or rebuild) its state, and yield a writer.

    ``default_meta`` (or a function that makes it, called only when needed) is the metadata
    of a folder made by hand. With ``wait=False`` a lock held by someone else raises
    :class:`LockBusy` at once.
    """
    with contextlib.ExitStack() as stack:
        try:
            got = stack.enter_context(conv_lock(conv, blocking=wait))
        except FileNotFoundError:
            raise NotFound(f"no conversation folder {conv.dir}") from None
        if not got:
            raise LockBusy(f"{conv.id} is locked by another writer")
        meta = read_metadata(conv)
        adopted = False
        if meta is None:
            has_inbox = conv.inbox.is_dir()
            if default_meta is None or not (has_inbox or conv.log.exists()):
                raise NotFound(f"{conv.id} has no readable metadata.json")
            if os.path.lexists(conv.metadata):
                # a file that does not read (an editor saving it in place, a broken edit) is
                # the person's, with their model, options and decisions: never replaced by
                # the defaults; the daemon tries again (its save wakes it)
                why = read_json_why(conv.metadata)[1] or "not the fields of one"
                raise InputRejected(
                    f"{conv.id}: metadata.json does not read as a conversation's metadata "
                    f"({why}: being saved, or a broken edit); it is left as it is, and the "
                    "conversation waits until it reads"
                )
            meta = default_meta() if callable(default_meta) else default_meta
            adopt_folder(conv, has_inbox=has_inbox)
            adopted = True
        state = read_state(conv)
        missing = state is None
        listing: list[str] | None = None
        if state is None:
            listing = list_folder(conv)
            state = rebuild_state(conv, meta, listing)
        rebuilt = missing and not adopted
        w = ConvWriter(conv, meta, state, durable=durable, rebuilt=rebuilt, listing=listing)
        # A folder made by hand: its metadata and state are the defaults and what the log
        # says, so they are rebuilt alike if a power loss takes them. Its state is written
        # at once (see mark_log_start); the first save writes its metadata (off the loop,
        # with the turn's first state write) and makes the folder durable (the new log's
        # name) before any block in it is counted or its claimed file removed: a durable
        # save does with its rename's folder fsync, one that is not (flush() at the end)
        # with its blocks' point.
        w.unsaved = w.meta_unsaved = w.folder_unsynced = adopted
        if adopted and missing:
            w.mark_log_start()
        stack.callback(w.close)
        if rebuilt:
            w.warn("state.json was missing or unreadable; rebuilt it from messages.log")
        yield w


def rebuild_state(conv: Conv, meta: Metadata, listing: list[str] | None = None) -> State:
    """A state derived from the log alone (when state.json is lost or corrupt, or the folder
    was made by hand), under the conversation's lock. ``listing``: the folder's names."""
    st = State(updated=now_iso())
    try:
        info: os.stat_result | None = os.stat(conv.log, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    names = listing if listing is not None else list_folder(conv)
    if (info is None or not info.st_size) and not log_segments(conv, lambda: names)[:-1]:
        st.log = LogIdentity(ino=info.st_ino if info is not None else 0, size=0)
        return st  # no log or an empty one, and no rotated segments: nothing to count
    for path in log_segments(conv, lambda: names):  # rotated segments, then the live log
        live = path == conv.log
        try:
            fd, info = open_regular_stat(path)
        except (FileNotFoundError, InputRejected):
            if live and os.path.lexists(path):
                raise  # a live log that is a link or a FIFO: not a log to count
            continue
        size = 0
        errors: list[str] = []
        try:  # block by block: a log of any size is counted in bounded memory
            for part in logstream.stream(fd, agent_label=meta.agent_label):
                st.turns += sum(b.kind.value == "model" and not b.interrupted for b in part.blocks)
                st.messages_processed += sum(own_block(b) for b in part.blocks)
                size += part.size
                errors.extend(part.errors[: 20 - len(errors)])
        finally:
            os.close(fd)
        if live:
            st.log = LogIdentity(ino=info.st_ino, size=size)
            st.parse_errors = errors
    return st
