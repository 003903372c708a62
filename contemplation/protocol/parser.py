"""Pure: bytes of ``messages.log`` → blocks, needs, markers.

The parser never raises on content. Junk (invalid UTF-8, NULs, CRLF, text before the first
header, a file that ends mid-line) is tolerated: the text is kept as it is and a description
of the problem is returned in :attr:`ParseResult.errors` for the caller to record.

It works on bytes so offsets are exact; it can start at any header offset (``base``), which
is what incremental parsing uses: re-parse only from the start of the last, still-open block.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from contemplation.protocol.logformat import (
    ATTACHMENT_LINE_RE,
    ATTACHMENT_OPEN,
    FRAME,
    HEADER_RE,
    MARKER_RE,
    NEED_PREFIX,
    RESPONSE_PREFIX,
    canonical_need,
    uninert,
)
from contemplation.values import Block, BlockKind, ImageRef, MarkerKind, ParseResult

MAX_NEED_CHARS = 1000
_STUFFED = " " + FRAME  # a body line shaped like a frame, as the writer stuffs it
_FRAME = FRAME.encode()
_LINE_FRAME = b"\n" + _FRAME
_LINE_NEED = "\n" + NEED_PREFIX

# Python's re tries a MULTILINE "^" at every byte, so line starts are found with str.find
# (memchr speed) instead; it keeps a 10 MB log well under 100 ms.


def _unstuff(text: str) -> str:
    """Remove the one space the writer put before body lines shaped like ``^ *===``."""
    if _STUFFED not in text:
        return text
    out: list[str] = []
    pos = 0
    i = text.find(_STUFFED)
    while i >= 0:
        start = text.rfind("\n", 0, i) + 1
        if start >= pos and not text[start : i + 1].strip(" "):
            out.append(text[pos:start])
            pos = start + 1
        i = text.find(_STUFFED, i + len(_STUFFED))
    out.append(text[pos:])
    return "".join(out)


def find_needs(text: str) -> tuple[str, ...]:
    """``NEED:`` lines (at a line start) of a model block's text, in canonical form."""
    if NEED_PREFIX not in text:
        return ()
    out: list[str] = []
    at_start, n = text.startswith(NEED_PREFIX), len(NEED_PREFIX)
    i = 0 if at_start else text.find(_LINE_NEED) + 1
    while i > 0 or (i == 0 and at_start):
        end = text.find("\n", i)
        need = canonical_need(text[i + n : end if end >= 0 else len(text)])[:MAX_NEED_CHARS]
        if need:
            out.append(need)
        if end < 0:
            break
        i = text.find(_LINE_NEED, end) + 1
        if i == 0:
            break
    return tuple(out)


def find_responses(text: str) -> tuple[str, ...]:
    """The needs an agent block answers: its leading ``RESPONSE TO NEED:`` lines (one block
    may answer many, e.g. the needs past a reply's limit), in canonical form."""
    out: list[str] = []
    pos = 0
    while text.startswith(RESPONSE_PREFIX, pos):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        out.append(canonical_need(text[pos + len(RESPONSE_PREFIX) : end])[:MAX_NEED_CHARS])
        pos = end + 1
    return tuple(out)


def _frame_lines(data: bytes) -> Iterable[tuple[int, int]]:
    """(start, end-of-line) of every line that starts with ``===`` (stuffed lines cannot)."""
    first = data.startswith(_FRAME)
    i = 0 if first else data.find(_LINE_FRAME) + 1
    while i > 0 or (i == 0 and first):
        end = data.find(b"\n", i)
        end = len(data) if end < 0 else end
        yield i, end
        i = data.find(_LINE_FRAME, end) + 1
        if i == 0:
            return


def _decode(raw: bytes, at: int, errors: list[str]) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append(f"invalid UTF-8 at byte {at + exc.start} (kept in the file, read as U+FFFD)")
        text = raw.decode("utf-8", errors="replace")
    if "\x00" in text:
        errors.append(f"NUL bytes in the block at byte {at} (kept in the file)")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    return _unstuff(text)


class _Draft:
    __slots__ = (
        "body",
        "end",
        "markers",
        "offset",
        "recipient",
        "sender",
        "thinking",
        "timestamp",
        "truncated",
    )

    def __init__(self, sender: str, recipient: str, ts: str, offset: int) -> None:
        self.sender = sender
        self.recipient = recipient
        self.timestamp = ts
        self.offset = offset
        self.end = offset
        self.body: list[str] = []
        self.thinking: list[str] = []
        self.markers: list[tuple[MarkerKind, str]] = []
        self.truncated = False


def _finish(d: _Draft, agent_label: str) -> Block:
    text = "".join(d.body).rstrip("\n")
    kind = BlockKind.AGENT if d.sender == agent_label else BlockKind.MODEL
    needs: tuple[str, ...] = ()
    responds: tuple[str, ...] = ()
    images: tuple[ImageRef, ...] = ()
    if kind is BlockKind.MODEL:
        needs = find_needs(text)
    else:
        images, text = _attachments(text)
        if text.startswith(RESPONSE_PREFIX):
            responds = find_responses(text)
    kinds = {m for m, _ in d.markers}
    return Block(
        sender=d.sender,
        recipient=d.recipient,
        timestamp=d.timestamp,
        kind=kind,
        text=text,
        offset=d.offset,
        end=d.end,
        thinking="".join(d.thinking),
        needs=needs,
        images=images,
        response_to=responds[0] if responds else None,
        responds=responds,
        complete=MarkerKind.COMPLETE in kinds and kind is BlockKind.MODEL,
        interrupted=MarkerKind.INTERRUPTED in kinds,
        markers=tuple(d.markers),
        truncated=d.truncated,
    )


def _attachments(text: str) -> tuple[tuple[ImageRef, ...], str]:
    """An agent block's images (its writer's ``[attachment: …]`` lines of an image type: at
    a line start in the file) and its text with the stuffed lines given back their shape."""
    if ATTACHMENT_OPEN not in text:
        return (), text
    images = tuple(
        ImageRef(m["name"], m["mime"], m["sha"])
        for m in ATTACHMENT_LINE_RE.finditer(text)
        if m["mime"].startswith("image/")
    )
    return images, uninert(text)


def _frames(
    data: bytes,
) -> Iterable[tuple[int, int, re.Match[bytes] | None, re.Match[bytes] | None]]:
    for start, eol in _frame_lines(data):
        line = data[start:eol]
        h = HEADER_RE.match(line)
        mk = None if h else MARKER_RE.match(line)
        if h or mk:
            yield start, min(eol + 1, len(data)), h, mk


def parse(data: bytes, *, agent_label: str = "CLAUDE", base: int = 0) -> ParseResult:
    """Parse ``data`` (the log from byte ``base`` on) into blocks."""
    errors: list[str] = []
    blocks: list[Block] = []
    preamble_parts: list[str] = []
    draft: _Draft | None = None
    in_thinking = False
    pos = 0

    def take_text(start: int, stop: int) -> None:
        if stop <= start:
            return
        text = _decode(data[start:stop], base + start, errors)
        if draft is None:
            preamble_parts.append(text)
        elif in_thinking:
            draft.thinking.append(text)
        else:
            draft.body.append(text)

    for start, end, h, mk in _frames(data):
        take_text(pos, start)
        pos = end
        if h is not None:
            if draft is not None:
                draft.end = base + start
                blocks.append(_finish(draft, agent_label))
            draft = _Draft(
                h.group(1).decode(), h.group(2).decode(), h.group(3).decode(), base + start
            )
            in_thinking = False
            continue
        assert mk is not None
        kind = MarkerKind(mk.group(1).decode())
        detail = (mk.group(2) or b"").decode("utf-8", errors="replace")
        if draft is None:
            preamble_parts.append(data[start:end].decode("utf-8", errors="replace"))
            continue
        if kind is MarkerKind.THINKING:
            in_thinking = True
        elif kind is MarkerKind.END_THINKING:
            in_thinking = False
        draft.markers.append((kind, detail))
    take_text(pos, len(data))
    if draft is not None:
        draft.end = base + len(data)
        draft.truncated = bool(data) and not data.endswith(b"\n")
        blocks.append(_finish(draft, agent_label))
        if draft.truncated:
            errors.append(
                f"the last block (at byte {draft.offset}) ends without a newline: "
                "it may still be being written"
            )
    preamble = "".join(preamble_parts)
    if preamble.strip():
        errors.append(
            f"{len(preamble.encode())} bytes before the first header at byte {base} "
            "(kept in the file, not a message)"
        )
    return ParseResult(
        blocks=tuple(blocks), size=len(data), preamble=preamble, errors=tuple(errors)
    )


def merge(previous: ParseResult, tail: ParseResult, tail_base: int) -> ParseResult:
    """Combine a parse of the whole log with a re-parse that starts at ``tail_base``.

    ``tail_base`` must be the offset of a header in ``previous`` (normally the last block's),
    so every block before it is final and kept as is.
    """
    kept = tuple(b for b in previous.blocks if b.offset < tail_base)
    return ParseResult(
        blocks=kept + tail.blocks,
        size=tail_base + tail.size,
        preamble=previous.preamble,
        errors=tuple(e for e in previous.errors if "ends without a newline" not in e) + tail.errors,
    )
