"""Full-text search over the conversation logs, bounded in every direction.

Case-insensitive (Unicode simple case folding, via :data:`re.IGNORECASE` on a literal). Each
conversation is read from its first byte, at most ``per_conv_bytes`` of it; the whole search
reads at most ``total_bytes`` and stops after ``max_results`` conversations or ``deadline_s``
seconds, saying which bound stopped it. It is blocking file I/O: the dashboard runs it in a
worker thread. Logs are opened as regular files only (links never followed, FIFOs never read).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from contemplation.errors import InputRejected
from contemplation.layout import Conv, Home, open_regular
from contemplation.reading import segments

_SPACES = re.compile(r"\s+")
# a block's header line (logformat.HEADER_RE, for text): framing, not what was said; a match
# inside one is not a hit ("claude" would find every conversation) and snippets leave them out
_HEADER_LINE = re.compile(r"=== [A-Z][A-Z0-9_]* -> [A-Z][A-Z0-9_]* \[[^\]\n]*\] ===\r?")
ROW_FIELDS = ("id", "topic", "model", "backend")


@dataclass(frozen=True, slots=True)
class Limits:
    per_conv_bytes: int = 4 << 20
    total_bytes: int = 64 << 20
    max_results: int = 50
    snippets_per_conv: int = 3
    hits_counted: int = 1000  # per conversation; more is reported as "more"
    context_chars: int = 60
    max_query_chars: int = 200
    deadline_s: float = 3.0


def check_query(raw: str, limits: Limits) -> str:
    q = raw.strip()
    if not q:
        raise InputRejected("the search needs a query: ?q=TEXT")
    if len(q) > limits.max_query_chars:
        raise InputRejected(
            f"the query is {len(q)} characters; the limit is {limits.max_query_chars}"
        )
    return q


def read_head(conv: Conv, budget: int) -> tuple[bytes, bool]:
    """The first ``budget`` bytes of the whole conversation (every segment, oldest first) and
    whether there was more."""
    parts: list[bytes] = []
    left = budget
    for seg in segments(conv):
        if left <= 0:
            return b"".join(parts), True
        try:
            fd = open_regular(seg.path)
        except (OSError, InputRejected):
            continue
        with os.fdopen(fd, "rb") as f:
            data = f.read(left + 1)
        if len(data) > left:
            parts.append(data[:left])
            return b"".join(parts), True
        parts.append(data)
        left -= len(data)
    return b"".join(parts), False


def _in_header(text: str, start: int, end: int) -> bool:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    return bool(_HEADER_LINE.fullmatch(text, line_start, len(text) if line_end < 0 else line_end))


def _said(lines: list[str]) -> str:
    """What was said, line by line (blank and header lines left out; the line breaks kept,
    runs of spaces within a line made one)."""
    kept = [ln for ln in lines if ln.strip() and not _HEADER_LINE.fullmatch(ln)]
    return "\n".join(_SPACES.sub(" ", ln) for ln in kept)


def _before(text: str, at: int, width: int) -> str:
    """Up to ``width`` characters said before ``at``; a line the window cuts is dropped unless
    it is the match's own (it may be half a header)."""
    lo = max(0, at - 3 * width)
    lines = text[lo:at].split("\n")
    if lo > 0 and len(lines) > 1:
        lines = lines[1:]
    said = _said(lines)
    if said and not lines[-1].strip():
        said += "\n"  # the match begins its line: the line before ends here
    return ("…" if lo > 0 or len(said) > width else "") + said[-width:].lstrip(" ")


def _after(text: str, at: int, width: int) -> str:
    hi = at + 3 * width
    lines = text[at:hi].split("\n")
    if hi < len(text) and len(lines) > 1:
        lines = lines[:-1]
    said = _said(lines)
    if said and not lines[0].strip():
        said = "\n" + said  # the match ends its line: what follows is on the next
    return said[:width].rstrip(" ") + ("…" if hi < len(text) or len(said) > width else "")


def snippets(
    text: str, pattern: re.Pattern[str], limits: Limits
) -> tuple[list[dict[str, Any]], int]:
    """Up to ``snippets_per_conv`` snippets (before / match / after, and the byte offset of the
    match in the conversation) and the number of hits counted (at most ``hits_counted``)."""
    out: list[dict[str, Any]] = []
    hits = 0
    pos = 0  # characters already converted to a byte offset
    offset = 0
    ctx = limits.context_chars
    for m in pattern.finditer(text):
        if _in_header(text, m.start(), m.end()):
            continue
        hits += 1
        if len(out) < limits.snippets_per_conv:
            offset += len(text[pos : m.start()].encode("utf-8", "surrogatepass"))
            pos = m.start()
            out.append(
                {
                    "before": _before(text, m.start(), ctx),
                    "match": m.group(0),
                    "after": _after(text, m.end(), ctx),
                    "offset": offset,
                }
            )
        if hits >= limits.hits_counted:
            break
    return out, hits


@dataclass
class _Scan:
    limits: Limits
    clock: Callable[[], float]
    started: float
    scanned: int = 0
    bytes_read: int = 0
    stopped: str | None = None

    def budget(self) -> int:
        """Bytes the next conversation may read (0: a bound has stopped the search)."""
        if self.clock() - self.started > self.limits.deadline_s:
            self.stopped = "time"
        elif self.bytes_read >= self.limits.total_bytes:
            self.stopped = "bytes"
        if self.stopped:
            return 0
        return min(self.limits.per_conv_bytes, self.limits.total_bytes - self.bytes_read)


def search(
    home: Home,
    rows: Iterable[dict[str, Any]],
    query: str,
    limits: Limits | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Search the logs of the conversations summarised in ``rows`` (newest activity first, as
    :meth:`contemplation.reading.Reader.summaries` gives them)."""
    limits = limits or Limits()
    q = check_query(query, limits)
    pattern = re.compile(re.escape(q), re.IGNORECASE)
    folded = q.casefold()
    scan = _Scan(limits, clock, clock())
    results: list[dict[str, Any]] = []
    todo = list(rows)
    for row in todo:
        budget = scan.budget()
        if not budget:
            break
        if len(results) >= limits.max_results:
            scan.stopped = "results"
            break
        conv = home.conv(str(row["id"]), completed=bool(row["completed"]))
        data, cut = read_head(conv, budget)
        scan.scanned += 1
        scan.bytes_read += len(data)
        found, hits = snippets(data.decode("utf-8", errors="replace"), pattern, limits)
        fields = [k for k in ROW_FIELDS if folded in str(row.get(k, "")).casefold()]
        if hits or fields:
            results.append(_result(row, found, hits, fields, cut=cut, limits=limits))
    return {
        "query": q,
        "results": results,
        "count": len(results),
        "scanned": {"conversations": scan.scanned, "of": len(todo), "bytes": scan.bytes_read},
        "stopped": scan.stopped,  # None, or the bound that ended the search early
        "limits": {
            "per_conversation_bytes": limits.per_conv_bytes,
            "total_bytes": limits.total_bytes,
            "max_results": limits.max_results,
        },
    }


def _result(
    row: dict[str, Any],
    found: list[dict[str, Any]],
    hits: int,
    fields: list[str],
    *,
    cut: bool,
    limits: Limits,
) -> dict[str, Any]:
    return {
        "id": row["id"],
        "topic": row.get("topic", ""),
        "status": row.get("status", ""),
        "completed": bool(row.get("completed")),
        "model": row.get("model", ""),
        "fields": fields,
        "hits": hits,
        "more_hits": hits >= limits.hits_counted,
        "snippets": found,
        "partial": cut,  # only the first per_conv_bytes of this log were searched
    }
