"""A part of a text file: the ``PATH lines A-B`` form, lines read in bounded memory and time,
and the note that says which lines an answer shows and the NEED line for the next part.

Every figure in a note is measured: the lines of a file are counted by reading it in chunks,
up to :data:`COUNT_CAP` bytes; past that the count is a lower bound and says so (``380,000+``).
A line is never held whole: only what an answer can show of it is kept, the rest is read past.
"""

from __future__ import annotations

import re
from typing import BinaryIO

from contemplation.errors import ToolError
from contemplation.needs.tools.base import ToolResult
from contemplation.protocol.logformat import NEED_PREFIX

COUNT_CAP = 64 * 1024 * 1024  # bytes of a file read at most (to count lines, to reach a line)
CHUNK = 1 << 20  # bytes read at a time past what an answer keeps
NEXT_DEFAULT = 40  # lines the next-part NEED asks for when nothing better is known

_RANGE_RE = re.compile(
    r"^(?P<path>.*?[^\s,(])[\s,(]+lines?\s+(?P<first>\d{1,9})"
    r"(?P<dash>\s*(?:-|\u2013|to\b)\s*(?P<last>\d{1,9})?)?\s*\)?\s*$",
    re.IGNORECASE,
)
_QUOTES = ("``", "''", '""', "\u201c\u201d", "\u2018\u2019")


def unquoted(path: str) -> str:
    """``path`` without one pair of quotes around it (small models love backticks)."""
    for pair in _QUOTES:
        if len(path) >= 2 and path[0] == pair[0] and path[-1] == pair[-1]:
            return path[1:-1].strip()
    return path


def split_range(requested: str) -> tuple[str, int, int | None]:
    """``PATH lines A-B`` → (PATH, A, B); ``line A`` → (PATH, A, A); ``lines A-`` → (PATH, A,
    None: to the end); a plain path → (PATH, 1, None). Also ``PATH (lines A to B)`` and
    ``"PATH", lines A-B``; the path loses one pair of quotes."""
    m = _RANGE_RE.match(requested.strip())
    if m is None:
        return unquoted(requested.strip()), 1, None
    path, first = unquoted(m["path"]), max(1, int(m["first"]))
    if m["last"] is not None:
        return path, first, max(first, int(m["last"]))
    return path, first, None if m["dash"] else first


class LineReader:
    """A binary file's lines, one at a time, each kept only up to a number of bytes; the
    bytes read and the lines passed are counted, and reading stops at :data:`COUNT_CAP`."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.n = 0  # lines passed (the last one returned is line n)
        self.scanned = 0  # bytes read
        self.capped = False  # stopped at COUNT_CAP inside a line

    def next(self, keep: int) -> bytes | None:
        """The next line's first ``keep`` bytes (the rest is read past, not kept); None at
        the end of the file."""
        head = self.f.readline(keep)
        if not head:
            return None
        self.scanned += len(head)
        self.n += 1
        tail = head
        while not tail.endswith(b"\n"):
            if self.scanned >= COUNT_CAP:
                self.capped = True
                break
            tail = self.f.readline(CHUNK)
            if not tail:
                break
            self.scanned += len(tail)
        return head

    def count_rest(self) -> tuple[int, bool]:
        """The file's number of lines: those passed and the newlines of the rest. Exact (True)
        unless the file is longer than COUNT_CAP: then a lower bound."""
        if self.capped:
            return self.n, False
        total, last = self.n, b"\n"
        while True:
            if self.scanned >= COUNT_CAP:
                return total, False
            chunk = self.f.read(CHUNK)
            if not chunk:
                break
            total += chunk.count(b"\n")
            last = chunk[-1:]
            self.scanned += len(chunk)
        return total + (last != b"\n"), True  # a last line with no newline counts too


def _skip_to(lines: LineReader, first: int, path: str) -> None:
    """Read past the lines before ``first``, within COUNT_CAP bytes."""
    while lines.n < first - 1 and not lines.capped and lines.scanned < COUNT_CAP:
        if lines.next(CHUNK) is None:
            raise ToolError(f"{path!r} has {lines.n:,} lines; there is no line {first:,}")
    if lines.n < first - 1 or lines.capped:
        raise ToolError(
            f"line {first:,} of {path!r} is past the first {COUNT_CAP:,} bytes, which is as "
            "far as a file is read"
        )


def read_part(
    f: BinaryIO, path: str, source: str, span: tuple[int, int | None], budget: int
) -> ToolResult:
    """Lines ``span`` = (first, last; None: to the end) of the open file ``f``, as many whole
    lines as fit ``budget`` characters (a first line longer than that: its first part); the
    note says which lines it shows of how many and the NEED line for the next part."""
    first, last = span
    lines = LineReader(f)
    _skip_to(lines, first, path)
    keep = budget * 4 + 4  # bytes that hold the budget's characters and one more
    shown: list[str] = []
    size = 0
    cut = exhausted = False
    while last is None or lines.n < last:
        raw = lines.next(keep)
        if raw is None:
            exhausted = True
            break
        line = raw.decode("utf-8", errors="replace")
        if size + len(line) > budget:
            if not shown:
                shown.append(line[:budget])  # one line longer than an answer
                cut = True
            break
        shown.append(line)
        size += len(line)
    if not shown:
        if lines.n == 0 and first == 1:
            return ToolResult("", source, False, "the file is empty")
        raise ToolError(f"{path!r} has {lines.n:,} lines; there is no line {first:,}")
    total, exact = (lines.n, True) if exhausted else lines.count_rest()
    end = first + len(shown) - 1
    note = part_note(path, first, end, last=last, total=total, exact=exact, cut=cut)
    return ToolResult("".join(shown), source, False, note)


def part_note(
    path: str, first: int, end: int, *, last: int | None, total: int, exact: bool, cut: bool
) -> str:
    """What part of the file an answer holds, and the NEED line for the next part."""
    of = f"{total:,}" + ("" if exact else "+")
    want = total if last is None else min(last, total)
    if cut:
        lines = f"{first + 1}-{min(want, first + NEXT_DEFAULT)}"
        nxt = f"{NEED_PREFIX} File contents of {path} lines {lines}"
        more = f"; the next part: {nxt}" if first < want else ""
        return f"line {first:,} of {of} is longer than an answer: its first part only{more}"
    if end < want:
        nxt_end = min(want, end + (end - first + 1))
        left = f"{want - end:,}" + ("" if exact or (last is not None and last <= total) else "+")
        return (
            f"showing lines {first:,}-{end:,} of {of}; {left} more line(s) — the next part: "
            f"{NEED_PREFIX} File contents of {path} lines {end + 1}-{nxt_end}"
        )
    if first > 1 or end < total:
        return f"lines {first:,}-{end:,} of {of}"
    return ""
