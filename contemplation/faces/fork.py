"""Fork a conversation: a new one whose log is blocks 1..N of another (:func:`fork`).

The CLI's ``fork``, MCP ``conversation_fork`` and the dashboard's "fork here" are faces of
this one function. The rules:

* N counts blocks from 1, over the rotated segments and the live log; the default is the
  last *finished* block. The last block is unfinished while a writer holds the conversation
  (a turn, an append), while state.json journals a write or a rotation that a crash left, a
  reply is marked as being generated, a message waits in ``processing/``, or its last line
  has no newline. Blocks before it are final (the log only grows at its end).
* A fork that would end in the middle of a NEED exchange (a reply's NEED with no answer by
  block N) is refused, the default included; the error names the blocks that are allowed.
* A block past the end, or one still being written: refused, one line, nothing made.
* The fork copies the blocks, the rotated segments that are whole within them (hard links),
  ``attachments/`` (hard links), and the metadata less the agent's ``approvals``, with
  ``forked_from: {id, block}``. Its state is rebuilt from its own log. Nothing in flight is
  copied: pending needs and approvals, queued inbox or processing files, the cancel flag, a
  server-side session (state.json's ``backend_session``), ``context/``.
* The fork is an ordinary conversation: the next message continues from block N. One that
  ends where a turn would be due (on the agent's own block, an answer, a cut-off reply) waits
  for that message all the same: a ``=== FORKED: … ===`` line ends its log, so no turn runs
  (forking before a cancelled runaway reply does not run it again), unless ``rerun`` asks the
  model to answer at once. One that ends on a COMPLETE reply is marked complete (so it is
  not archived at once) and goes on with the next message, as a reopened conversation does.
* The source is only read (under its lock, taken without waiting and shared: forks made at
  the same moment read together, each sees no writer and takes every finished block); an
  archived one is forked alike and stays in ``completed/``.
* The source's log is read block by block (:mod:`contemplation.store.logstream`) and only what
  the blocks say of the exchange is kept (their needs, answers and markers, not their text);
  its bytes are copied file to file. So a fork's memory does not grow with the log's size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from contemplation.errors import InputRejected, NotFound
from contemplation.models import APPROVALS_KEY, Block, MarkerKind, Metadata, Status
from contemplation.protocol import panel
from contemplation.protocol.conversation import unanswered
from contemplation.protocol.logformat import marker
from contemplation.store import logstream
from contemplation.store.layout import (
    ATTACHMENTS,
    Conv,
    Home,
    open_regular_stat,
    processing_entries,
    read_metadata,
    read_state,
)
from contemplation.store.logview import log_segments, segment_inodes
from contemplation.writer.files import conv_lock, now_iso
from contemplation.writer.forking import Head, Segment, build_fork, source_fd

FORKED_FROM = "forked_from"  # metadata.json: {"id": the source's id, "block": N}
NEED_HINT_SCAN = 1000  # blocks after N looked at for the first one past a NEED exchange


@dataclass(frozen=True, slots=True)
class Piece:
    """One file of the source's log as it was read: rotated segments oldest first, then
    the live ``messages.log``. Its blocks carry no text (see :func:`logstream.bare`)."""

    segment: Segment
    blocks: tuple[Block, ...]
    start: int  # the cursor of its first byte (see :mod:`contemplation.faces.reading`)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The source as one consistent read."""

    conv: Conv
    meta: Metadata
    pieces: tuple[Piece, ...]
    unfinished: str  # why the last block may still change ("" when it is finished)

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(b for p in self.pieces for b in p.blocks)

    @property
    def finished(self) -> int:
        n = sum(len(p.blocks) for p in self.pieces)
        return n - 1 if self.unfinished and n else n


@dataclass(frozen=True, slots=True)
class Forked:
    conv: Conv
    source: Conv
    block: int  # the fork holds blocks 1..block of the source
    source_blocks: int
    held: bool = False  # a turn was due at block N: the fork waits for the next message

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.conv.id,
            "path": str(self.conv.dir),
            FORKED_FROM: {"id": self.source.id, "block": self.block},
            "source_archived": self.source.is_completed,
            "blocks": self.block,
            "source_blocks": self.source_blocks,
            "waits_for_message": self.held,
        }


def fork(
    home: Home,
    conv: Conv,
    *,
    at: int | None = None,
    offset: int | None = None,
    topic: str | None = None,
    durable: bool = True,
    rerun: bool = False,
    seat: str | None = None,
) -> Forked:
    """Make a new conversation in ``active/`` from blocks 1..``at`` of ``conv`` (see the
    module's rules). ``offset``: the block that starts at that cursor instead of ``at`` (the
    dashboard's blocks carry their cursor). ``rerun``: where a turn is due at block N, the
    daemon runs it at once (else the fork waits for the next message). ``seat``: in a panel,
    the fork follows that seat's line alone (its label or model): a panel of that one seat,
    which sees only its own thread of the blocks taken."""
    if topic is not None and not topic.strip():
        raise InputRejected("a fork's topic cannot be empty")
    snap = snapshot(conv)
    n = choose(snap, at, offset)
    log, segments = cut(snap, n)
    meta = snap.meta if seat is None else following(snap.meta, seat)
    fields = meta.model_dump(mode="json")
    fields.pop(APPROVALS_KEY, None)
    fields.update(
        topic=(topic or snap.meta.topic).strip(),
        created=now_iso(),
        **{FORKED_FROM: {"id": conv.id, "block": n}},
    )
    status = _status(meta, snap.blocks[:n])
    held = status is Status.PENDING and not rerun
    hold = f"from {conv.id} at block {n}; the next message continues from here"
    made = build_fork(
        home,
        Metadata.model_validate(fields),
        log=log,
        segments=segments,
        attachments=conv.dir / ATTACHMENTS,
        status=Status.IDLE if held else status,
        durable=durable,
        then=marker(MarkerKind.FORKED, hold) if held else "",
    )
    return Forked(made, conv, n, len(snap.blocks), held)


def snapshot(conv: Conv) -> Snapshot:
    """Read the source's log (every segment) and say whether its last block is finished."""
    meta = read_metadata(conv)
    if meta is None:
        raise NotFound(
            f"{conv.id} has no readable metadata.json (a folder the daemon has not taken yet)"
        )
    try:
        with conv_lock(conv, blocking=False, shared=True) as got:  # other forks read too
            pieces = _read_pieces(conv, meta.agent_label, locked=got)
            why = "" if got else "a writer holds it: a turn or an append is in progress"
            state = read_state(conv) if got else None
            if state is not None and (state.intent is not None or state.rotation is not None):
                why = "a write a crash interrupted is recovered at the daemon's next step"
            elif state is not None and state.status is Status.GENERATING:
                why = "a reply is being generated"
            elif got and processing_entries(conv):
                why = "a message is being taken into the log"
    except FileNotFoundError:
        raise NotFound(f"{conv.id} moved while it was read (archived or reopened?)") from None
    last = next((p.blocks[-1] for p in reversed(pieces) if p.blocks), None)
    if not why and last is not None and last.truncated:
        why = "its last line is still being written"
    return Snapshot(conv, meta, pieces, why)


def _read_pieces(conv: Conv, label: str, *, locked: bool) -> tuple[Piece, ...]:
    """Every file of the log, read once, block by block; without the lock, again if a
    rotation ran meanwhile (the segments' inodes changed)."""
    pieces: list[Piece] = []
    for _ in range(20):
        before = segment_inodes(conv)
        pieces, start = [], 0
        for path in log_segments(conv):
            try:
                fd, st = open_regular_stat(path)
            except FileNotFoundError:
                continue
            blocks: list[Block] = []
            size = 0
            try:
                for part in logstream.stream(fd, agent_label=label):
                    blocks.extend(logstream.bare(b) for b in part.blocks)
                    size += part.size
            finally:
                os.close(fd)
            pieces.append(Piece(Segment(path, st.st_ino, size), tuple(blocks), start))
            start += size
        if locked or segment_inodes(conv) == before:
            break
    return tuple(pieces)


def choose(snap: Snapshot, at: int | None, offset: int | None = None) -> int:
    """The N a fork takes (see the module's rules); a refusal is one line."""
    cid, blocks, why = snap.conv.id, snap.blocks, snap.unfinished
    if offset is not None:
        at = _block_at(snap, offset)
    if at is None:
        if not snap.finished:
            raise InputRejected(
                f"{cid} has no finished block to fork" + (f" ({why})" if why else "")
            )
        at = snap.finished
    elif at < 1:
        raise InputRejected(f"block {at}: blocks are counted from 1")
    elif at > len(blocks):
        raise InputRejected(f"block {at} is past the end: {cid} has {len(blocks)} block(s)")
    elif at > snap.finished:
        raise InputRejected(
            f"block {at} of {cid} is still being written ({why}); fork at an earlier block, "
            "or once it is done"
        )
    _refuse_open_needs(snap, at)
    return at


def _block_at(snap: Snapshot, offset: int) -> int:
    n = 0
    for p in snap.pieces:
        for b in p.blocks:
            n += 1
            if p.start + b.offset == offset:
                return n
    raise InputRejected(f"no block of {snap.conv.id} starts at byte {offset}")


def _refuse_open_needs(snap: Snapshot, at: int) -> None:
    blocks = snap.blocks
    asker, missing = unanswered(blocks[:at])
    if not missing or asker is None:
        return
    k = next(i for i, b in enumerate(blocks[:at], start=1) if b is asker)
    after = next(
        (
            m
            for m in range(at + 1, min(snap.finished, at + NEED_HINT_SCAN) + 1)
            if not unanswered(blocks[:m])[1]
        ),
        None,
    )
    hints = [f"{k - 1} (before it)"] if k > 1 else []
    if after is not None:
        hints.append(f"{after} (after its answers)")
    where = "; fork at block " + " or ".join(hints) if hints else ""
    raise InputRejected(
        f"block {at} of {snap.conv.id} ends in the middle of a NEED exchange: block {k} asks "
        f"{len(missing)} need(s) not answered by then ({missing[0]!r}){where}"
    )


def cut(snap: Snapshot, n: int) -> tuple[Head, list[Segment]]:
    """The fork's live log (the file that holds block ``n``, up to its end less its blank
    lines, and one newline) and the rotated segments before that file, taken whole."""
    count = 0
    for i, p in enumerate(snap.pieces):
        if count + len(p.blocks) >= n:
            end = p.blocks[n - count - 1].end
            return Head(p.segment, _unblank(p.segment, end)), [q.segment for q in snap.pieces[:i]]
        count += len(p.blocks)
    raise InputRejected(f"block {n} is past the end: {snap.conv.id} has {count} block(s)")


def _unblank(seg: Segment, end: int) -> int:
    """How many of the first ``end`` bytes of the segment come before its trailing newlines
    (read backwards a little at a time, never the whole file)."""
    fd = source_fd(seg)
    try:
        while end > 0:
            step = min(end, 1 << 16)
            window = os.pread(fd, step, end - step)
            kept = len(window.rstrip(b"\n"))
            if kept or len(window) < step:
                return end - step + kept
            end -= step
        return 0
    finally:
        os.close(fd)


def following(meta: Metadata, seat: str) -> Metadata:
    """``meta`` as a fork that follows one seat of its panel (by label or model name)."""
    seats = meta.seats()
    if not seats:
        raise InputRejected(f"{meta.id} has no panel: there is no seat to follow (leave out seat)")
    found = [s for s in seats if seat.strip() in (s.label, s.model) or seat.upper() == s.label]
    if not found:
        named = ", ".join(f"{s.label} ({s.model})" for s in seats)
        raise InputRejected(f"{meta.id} has no seat {seat!r}; its seats: {named}")
    return meta.model_copy(update={"panel": found[:1], "debate": False, "synthesize": None})


def _status(meta: Metadata, blocks: tuple[Block, ...]) -> Status:
    """What the fork's state says before the daemon's first look at it."""
    _, nxt = panel.next_for(meta, blocks)
    if nxt.action == "complete":
        return Status.COMPLETE  # as a reopened conversation: the next message goes on
    if nxt.action == "idle":
        return Status.IDLE
    if nxt.action == "stopped":
        return Status.CANCELLED if nxt.reason == "cancelled" else Status.ERROR
    return Status.PENDING
