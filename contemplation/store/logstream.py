"""One file of a log read block by block, in bounded memory (:func:`stream`).

Whoever walks a whole log without keeping its text (the index, a fork, a state rebuilt from
the log) reads it through here: a chunk at a time, parsed into stretches of whole blocks, so
a log of any size costs at most ``MAX_BLOCK_BYTES`` and a chunk in memory. A block longer than
``MAX_BLOCK_BYTES`` is parsed from its first ``MAX_BLOCK_BYTES`` (to a line's end), with its
true end, and an error that says so; the rest of its bytes are passed over, never held.
Pure but for the reads (by position: a descriptor's own offset is neither used nor moved).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from contemplation.protocol.logformat import FRAME, FRAME_OPEN, HEADER_RE
from contemplation.protocol.parser import parse
from contemplation.values import Block, MarkerKind, ParseResult

CHUNK = 1 << 20  # bytes read at once
MAX_BLOCK_BYTES = 16 << 20  # a block longer than this is read by its first so many bytes
HEADER_LINE_MAX = 1024  # no header line is longer (two labels of 32 and a time)
_LINE_FRAME = b"\n" + FRAME.encode()
_UNFINISHED = "ends without a newline"  # the parser's error for a last line with no newline
_CUT = "were read (the bound is"  # in the error that says a block was read by its first bytes


@dataclass
class _Cut:
    """A block longer than the bound: its first bytes parsed, its end not yet found."""

    head: ParseResult
    start: int  # file offset of the first byte ``head`` covers
    kept: int  # bytes of the block that were parsed
    bound: int  # the bound it passed


def stream(
    fd: int,
    *,
    agent_label: str = "CLAUDE",
    start: int = 0,
    chunk: int = 0,
    max_block: int = 0,
) -> Iterator[ParseResult]:
    """The file open at ``fd`` from byte ``start`` (0, or a header's offset) to its end, as
    parses of successive stretches of whole blocks, in order; offsets are the file's and each
    result's ``size`` is the bytes it covers (they follow one another). What one parse of the
    whole file would give, but for a block longer than ``max_block`` (see the module).
    ``chunk`` and ``max_block``: 0 for the module's ``CHUNK`` and ``MAX_BLOCK_BYTES``."""
    chunk, max_block = chunk or CHUNK, max_block or MAX_BLOCK_BYTES
    pos = start  # file offset of buf[0]
    at = start  # where the next read starts
    buf = b""
    scan = 0  # buf's complete lines before this index were looked at for a header already
    cut: _Cut | None = None
    last = b""  # the last byte read (a file that ends without a newline)
    while data := os.pread(fd, chunk, at):
        at += len(data)
        last = data[-1:]
        buf += data
        if cut is not None:
            h = _first_header(buf)
            if not h:  # still inside the long block: keep only a line that may be a header
                nl = buf.rfind(b"\n")
                keep = nl if nl >= 0 and len(buf) - nl <= HEADER_LINE_MAX else len(buf)
                buf, pos = buf[keep:], pos + keep
                continue
            yield _ended(cut, pos + h, truncated=False)
            buf, pos, scan, cut = buf[h:], pos + h, 0, None
        end = _last_header(buf, scan)
        if end:
            yield _parsed(buf[:end], pos, agent_label)
            buf, pos = buf[end:], pos + end
        elif len(buf) > max_block:
            nl = buf.rfind(b"\n", 0, max_block)
            kept = nl + 1 if nl > 0 else max_block
            # the rest kept from the kept part's last newline on: a header may follow it
            skip = nl if nl > 0 else kept
            head, buf = buf[:kept], buf[skip:]  # (the long buffer let go before the parse)
            cut = _Cut(_parsed(head, pos, agent_label), pos, kept, max_block)
            head, pos = b"", pos + skip
            continue
        scan = max(buf.rfind(b"\n"), 0)
    if cut is not None:
        h = _first_header(buf + b"\n")  # a header the file ends in, with no newline yet
        if not h:
            yield _ended(cut, at, truncated=last != b"\n")
            return
        yield _ended(cut, pos + h, truncated=False)
        buf, pos = buf[h:], pos + h
    if buf:
        yield _parsed(buf, pos, agent_label)


_CONTINUED = f"{FRAME_OPEN}{MarkerKind.CONTINUED.value}".encode()


def parse_segment(data: bytes, *, agent_label: str = "CLAUDE") -> ParseResult:
    """Parse one file of the log. The ``=== CONTINUED ... ===`` line a rotation writes at the
    top of a new ``messages.log`` is a system line, not text before the first header."""
    skip = 0
    if data.startswith(_CONTINUED):
        nl = data.find(b"\n")
        skip = len(data) if nl < 0 else nl + 1
    result = parse(data[skip:], agent_label=agent_label, base=skip)
    return dataclasses.replace(result, size=result.size + skip) if skip else result


def bare(b: Block) -> Block:
    """A block without its text and thinking (where it is and what it says of the exchange:
    needs, answers, markers), its labels shared with every other block's (a few hundred
    bytes a block): what a reader of a whole long log may hold of each block."""
    return dataclasses.replace(
        b, text="", thinking="", sender=sys.intern(b.sender), recipient=sys.intern(b.recipient)
    )


def cut_notes(errors: tuple[str, ...]) -> list[str]:
    """Of a stretch's errors, those that say a block was read by its first bytes only."""
    return [e for e in errors if _CUT in e]


def _parsed(data: bytes, base: int, agent_label: str) -> ParseResult:
    if base == 0:  # the file's start: a rotation's CONTINUED line is no text
        return parse_segment(data, agent_label=agent_label)
    return parse(data, agent_label=agent_label, base=base)


def _ended(cut: _Cut, end: int, *, truncated: bool) -> ParseResult:
    """The long block's parse, with its true end (``end``: the next header or the end of the
    file) and an error that says which bytes were left out."""
    head = cut.head
    blocks = list(head.blocks)
    where = blocks[-1].offset if blocks else cut.start
    if blocks:
        blocks[-1] = dataclasses.replace(blocks[-1], end=end, truncated=truncated)
    errors = [e for e in head.errors if _UNFINISHED not in e]
    errors.append(
        f"the block at byte {where} is {end - where} bytes: only its first {cut.kept} were "
        f"{_CUT} {cut.bound} bytes a block; the file is left as it is)"
    )
    if truncated and blocks:
        errors.append(
            f"the last block (at byte {where}) ends without a newline: "
            "it may still be being written"
        )
    return ParseResult(
        blocks=tuple(blocks), size=end - cut.start, preamble=head.preamble, errors=tuple(errors)
    )


def _is_header(buf: bytes, i: int) -> bool | None:
    """Is the line that starts at ``i`` a header? None: its end is not read yet."""
    eol = buf.find(b"\n", i)
    if eol < 0:
        return None
    return HEADER_RE.match(buf[i:eol]) is not None  # (``^`` holds only at a string's start)


def _last_header(buf: bytes, lo: int) -> int:
    """The start of the last whole header line in ``buf`` after its first byte, looked for
    from index ``lo`` on (0: none)."""
    hi = len(buf)
    while (i := buf.rfind(_LINE_FRAME, lo, hi)) >= 0:
        if _is_header(buf, i + 1):
            return i + 1
        hi = i
    return 0


def _first_header(buf: bytes) -> int:
    """The start of the first whole header line in ``buf`` after a newline (0: none)."""
    i = buf.find(_LINE_FRAME)
    while i >= 0:
        if _is_header(buf, i + 1):
            return i + 1
        i = buf.find(_LINE_FRAME, i + 1)
    return 0
