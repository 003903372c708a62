"""A search hit's snippet: the words around the first match in its block, the matches marked
«…», made from a bounded stretch of the block's compressed text in the index.

FTS5's own ``snippet()`` scores every window of a block against every match in it: its time
grows with the square of the matches (160 KB of one word: 12 s; a 50 MB block: minutes) and
SQLite cannot interrupt it. Here the text is decompressed a piece at a time (incremental
blob I/O, never the whole block) and searched for the first match of the query's words; at
most :data:`SCAN_CHARS` are read, and the caller's bound is asked between pieces. A block
with no match in that stretch (a match only past it, or one the tokenizer folds, such as an
accent) is shown by its beginning.
"""

from __future__ import annotations

import codecs
import re
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CONTEXT = 60  # characters shown on each side of the match (about FTS5's 16 tokens)
SCAN_CHARS = 16 << 20  # the most of a block read for its first match
PIECE = 1 << 20  # characters decompressed at a time
_BLOB_READ = 64 << 10
_CARRY = 256  # characters kept from one piece to the next (a match across them, context)
_SPACE = re.compile(r"\s")


@dataclass(frozen=True, slots=True)
class Marks:
    """What a snippet marks: ``pattern`` (see :meth:`contemplation.index.query.Parsed.pattern`)
    and ``needles``, words one of which (lower case) a piece must hold to be searched."""

    pattern: re.Pattern[str] | None
    needles: tuple[str, ...] = ()

    def search(self, text: str) -> re.Match[str] | None:
        if self.pattern is None:
            return None
        if self.needles:
            low = text.lower()
            if not any(n in low for n in self.needles):
                return None
        return self.pattern.search(text)


def of_block(
    conn: sqlite3.Connection,
    block_id: int,
    marks: Marks,
    over: Callable[[], bool],
    columns: tuple[str, ...] = ("zbody",),
) -> str:
    """The snippet of block ``block_id``: its first match in ``columns`` (in that order),
    else the beginning of the first that has text."""
    first = ""
    for column in columns:
        try:
            blob = conn.blobopen("blocks", column, block_id, readonly=True)
        except sqlite3.Error:  # no such text (NULL: the block has none)
            continue
        with blob:
            got, matched = of_text(_pieces(blob), marks, over)
        if matched:
            return got
        first = first or got
    return first


def _pieces(blob: sqlite3.Blob) -> Iterator[str]:
    """The text of a zlib-compressed blob, a bounded piece at a time."""
    inflate = zlib.decompressobj()
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while not inflate.eof:
        raw = inflate.unconsumed_tail or blob.read(_BLOB_READ)
        if not raw:
            break
        out = inflate.decompress(raw, PIECE)
        if out:
            yield decode.decode(out)
    yield decode.decode(inflate.flush(), final=True)


def of_text(pieces: Iterator[str], marks: Marks, over: Callable[[], bool]) -> tuple[str, bool]:
    """(the snippet, whether it holds a match) of a text given a piece at a time."""
    text, start, read = "", 0, 0  # text: the pieces from character ``start`` on
    head = ""
    for piece in pieces:
        text += piece
        head = head or text[: 2 * CONTEXT]
        m = marks.search(text)
        if m is not None:
            if len(text) - m.end() <= CONTEXT:  # enough after the match for its context
                text += next(pieces, "")
            return _around(text, m, marks.pattern, start)
        read += len(piece)
        if read >= SCAN_CHARS or over():
            break
        start += max(0, len(text) - _CARRY)
        text = text[-_CARRY:]
    return _head(head, text if start == 0 else ""), False


def _around(
    text: str, m: re.Match[str], pattern: re.Pattern[str] | None, start: int
) -> tuple[str, bool]:
    lo = max(0, m.start() - CONTEXT)
    hi = min(len(text), m.end() + CONTEXT)
    if lo > 0:
        cut = _SPACE.search(text, lo, m.start())
        lo = cut.end() if cut else lo
    if hi < len(text):
        cuts = list(_SPACE.finditer(text, m.end(), hi))
        hi = cuts[-1].start() if cuts else hi
    window = text[lo:hi]
    if pattern is not None:
        window = pattern.sub(lambda x: f"«{x.group(0)}»", window)
    before = "…" if start + lo > 0 else ""
    after = "…" if hi < len(text) else ""
    return f"{before}{window}{after}", True


def _head(head: str, whole: str) -> str:
    """A block's beginning (``whole``: its whole text when that was read)."""
    if whole and len(whole) <= 2 * CONTEXT:
        return whole
    cuts = list(_SPACE.finditer(head))
    return (head[: cuts[-1].start()] if cuts else head) + "…"
