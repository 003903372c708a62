"""The log as cursor space: a byte offset into the whole conversation (the rotated segments,
oldest first, then the live ``messages.log``, laid end to end), and the whole blocks after a
cursor. Rotation only renames files, so offsets already handed out stay valid; a cursor
stops before a reply still being written, so the next read returns that block whole.

Read-only and pure but for the reads: the faces (through :mod:`contemplation.faces.reading`) and
the notifier use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contemplation.errors import InputRejected
from contemplation.protocol import escalation, structured
from contemplation.protocol.logformat import MARKER_RE
from contemplation.protocol.parser import parse
from contemplation.store import logstream
from contemplation.store.layout import Conv, open_regular
from contemplation.store.logstream import parse_segment
from contemplation.store.logview import log_segments, segment_inodes
from contemplation.values import Block, MarkerKind

_HIDDEN_MARKERS = {MarkerKind.THINKING, MarkerKind.END_THINKING}


@dataclass(frozen=True, slots=True)
class Segment:
    path: Path
    start: int  # cursor of its first byte
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def segments(conv: Conv) -> list[Segment]:
    """The files of the log with their place in the cursor space (stable across a rotation)."""
    for _ in range(20):
        before = segment_inodes(conv)
        out: list[Segment] = []
        start = 0
        for p in log_segments(conv):
            try:
                size = os.stat(p, follow_symlinks=False).st_size
            except FileNotFoundError:
                size = 0
            out.append(Segment(p, start, size))
            start += size
        if segment_inodes(conv) == before:
            return out
    return out


def read_range(path: Path, offset: int, size: int) -> bytes:
    """The bytes of ``path`` from ``offset`` up to ``size`` (none if the file is gone)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(max(0, size - offset))
    except FileNotFoundError:
        return b""


def segment_blocks(seg: Segment, agent_label: str = "CLAUDE") -> Iterator[Block]:
    """The blocks of a rotated segment, in order, read a stretch at a time (see
    :mod:`contemplation.store.logstream`: a segment of any size is never held whole)."""
    try:
        fd = open_regular(seg.path)
    except (FileNotFoundError, InputRejected):
        return
    try:
        for part in logstream.stream(fd, agent_label=agent_label):
            yield from part.blocks
    finally:
        os.close(fd)


AGENT_SOURCE = "(source: agent,"  # the line under an agent's own RESPONSE TO NEED


def own(kind: str, response: bool, text: str) -> bool:
    """A block the agent wrote: a message, or its own answer to a need (a rule's answer is
    the tool's words, not the agent's, and a cursor must not pass over it)."""
    if kind != "agent":
        return False
    if not response:
        return True
    lines = text.split("\n", 2)
    return len(lines) > 1 and lines[1].startswith(AGENT_SOURCE)


def own_block(b: Block) -> bool:
    return own(b.kind.value, b.response_to is not None, b.text)


def block_dict(b: Block, offset: int, *, thinking: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {
        "offset": offset,
        "from": b.sender,
        "to": b.recipient,
        "time": b.timestamp,
        "kind": b.kind.value,
        "text": b.text,
    }
    if b.needs:
        d["needs"] = list(b.needs)
    if b.response_to is not None:
        d["response_to"] = b.response_to
    if b.complete:
        d["complete"] = True
    if b.interrupted:
        d["interrupted"] = True
    matched, value = structured.parsed(b)
    if matched:
        d["parsed"] = value  # the reply matched the schema its message asked for
    if (rung := escalation.rung_of(b)) is not None:
        d["rung"] = rung  # a rung of the escalation ladder wrote it
    if (seat := escalation.seat_of(b)) is not None:  # a seat of a panel rung
        d["seat"] = {"number": seat.k, "of": seat.n, "model": seat.model}
    ups = [s for k, t in b.markers if k is MarkerKind.ESCALATED and (s := escalation.read(t))]
    if ups:  # the reply failed and the turn went up the ladder
        d["escalated"] = {"cause": ups[-1].cause, "to": ups[-1].to}
    marks = [[k.value, t] for k, t in b.markers if k not in _HIDDEN_MARKERS]
    if marks:
        d["markers"] = marks
    if thinking and b.thinking:
        d["thinking"] = b.thinking
    return d


def _loose_markers(preamble: str, offset: int) -> list[dict[str, Any]]:
    """System lines that follow the cursor but belong to an earlier block (e.g. an ERROR)."""
    out: list[dict[str, Any]] = []
    for line in preamble.splitlines():
        m = MARKER_RE.match(line.encode())
        if m and m.group(1) != MarkerKind.CONTINUED.value.encode():
            text = (m.group(2) or b"").decode("utf-8", errors="replace")
            out.append(
                {"offset": offset, "kind": "marker", "marker": m.group(1).decode(), "text": text}
            )
    return out


@dataclass(frozen=True, slots=True)
class Since:
    blocks: list[dict[str, Any]]
    cursor: int  # where the next read starts
    total: int  # bytes of the whole conversation
    partial: dict[str, Any] | None = None  # a reply still being written (not past the cursor)
    reset: bool = False  # the cursor was beyond the log (it was replaced or cut): read from 0


def blocks_since(
    conv: Conv,
    cursor: int,
    *,
    agent_label: str = "CLAUDE",
    writing_at: int | None = None,
    thinking: bool = False,
) -> Since:
    """Whole blocks after ``cursor``. ``writing_at``: offset in the live log where a write is
    in flight (state.json's intent); a block from there on may still grow."""
    segs = segments(conv)
    total = segs[-1].end if segs else 0
    reset = cursor < 0 or cursor > total
    if reset:
        cursor = 0
    out: list[dict[str, Any]] = []
    last: Block | None = None
    for seg in segs:
        if seg.end <= cursor:
            continue
        local = max(0, cursor - seg.start)
        data = read_range(seg.path, local, seg.size)
        if not data:
            continue
        result = (
            parse_segment(data, agent_label=agent_label)
            if local == 0
            else parse(data, agent_label=agent_label)
        )
        out.extend(_loose_markers(result.preamble, seg.start + local))
        for b in result.blocks:
            start = seg.start + local + b.offset
            out.append(block_dict(b, start, thinking=thinking))
            last = b
    new_cursor = total
    partial = None
    growing = (
        writing_at is not None and segs and out and out[-1]["offset"] >= segs[-1].start + writing_at
    )
    if last is not None and out[-1].get("kind") != "marker" and (last.truncated or growing):
        partial = out.pop()
        new_cursor = int(partial["offset"])
    return Since(out, new_cursor, total, partial, reset)


def log_text(conv: Conv) -> str:
    """The whole conversation as text (every segment, oldest first)."""
    parts: list[bytes] = []
    for seg in segments(conv):
        parts.append(read_range(seg.path, 0, seg.size))
    return b"".join(parts).decode("utf-8", errors="replace")
