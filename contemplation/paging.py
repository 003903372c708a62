"""Pure: results an agent can hold. A page of blocks fits a byte budget; a long block is cut at a
line boundary, and the cursor handed back continues exactly at the cut, so repeated calls read
every block once and nothing twice.

A cursor is a byte offset into the whole conversation at a block boundary (see
:mod:`contemplation.reading`), or, after a cut inside a block, a position strictly inside it:
``header + 1 + bytes of its text already shown``. The text of a block is never longer than
its body in the log (stuffing only adds, thinking and markers are left out), so such a
position always falls before the block's end and means the same block on the next call.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contemplation.errors import InputRejected

PAGE_BYTES = 32_000  # the default budget of one result's blocks
PAGE_CAP = 64_000  # the most a caller may ask for: well under 25,000 tokens of any script
PAGE_FLOOR = 2_000


def size(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())


def continuation(block: dict[str, Any], shown: int) -> dict[str, Any]:
    """``block`` (a :func:`~contemplation.reading.block_dict`) less the first ``shown`` bytes
    of its text, marked as the rest of a block cut before."""
    raw = str(block.get("text", "")).encode()
    rest = {k: v for k, v in block.items() if k != "parsed"}  # the whole answer's, not the rest's
    return rest | {"text": raw[shown:].decode("utf-8", errors="replace"), "continues": shown}


def cut_text(text: str, room: int) -> str:
    """The longest head of ``text`` of at most ``room`` bytes that ends at a line boundary (a
    single line longer than that is cut at a character boundary)."""
    raw = text.encode()
    if len(raw) <= room:
        return text
    head = raw[: max(room, 1)]
    nl = head.rfind(b"\n")
    if nl > 0:
        head = head[: nl + 1]
    return head.decode("utf-8", errors="ignore")


@dataclass
class Page:
    blocks: list[dict[str, Any]] = field(default_factory=list)
    cursor: int | None = None  # None: every block offered fit (the caller's own cursor holds)
    cut: dict[str, Any] | None = None


def fit(
    offered: list[tuple[dict[str, Any], int]],
    budget: int,
    *,
    keep: Callable[[dict[str, Any]], bool],
) -> Page:
    """Blocks of ``offered`` (each with the bytes of its text already shown before this
    page) while they fit ``budget``; ``keep`` says which are shown at all (the others are
    passed over, free). The first block that does not fit ends the page: cut inside when it is
    the first one shown, else left whole for the next call."""
    page = Page()
    used = 2  # the list's brackets, and a comma before every block but the first
    for block, before in offered:
        if not keep(block):
            continue
        need = size(block) + (1 if page.blocks else 0)
        if used + need <= budget:
            page.blocks.append(block)
            used += need
            continue
        text = str(block.get("text", ""))
        if page.blocks:  # the next call starts at this block
            page.cursor = int(block["offset"]) + (1 + before if before else 0)
            page.cut = {"reason": "budget", "budget": budget, "next_block": block["offset"]}
            return page
        # a structured reply cut in pieces: its text is the answer, not a parsed copy
        part = {k: v for k, v in block.items() if k != "parsed"}
        need = size(part)  # the first block of the page: no comma
        room = max(budget - used - (need - size(text)), 256)
        head = cut_text(text, room)
        for _ in range(8):  # the JSON form escapes (a newline is two bytes): shrink to fit
            over = size(part | {"text": head, "cut": True}) - (budget - used)
            if over <= 0 or room <= 256:
                break
            room = max(len(head.encode()) - over, 256)
            head = cut_text(text, room)
        shown = len(head.encode())
        page.blocks.append(part | {"text": head, "cut": True})
        page.cursor = int(block["offset"]) + 1 + before + shown
        page.cut = {
            "reason": "budget",
            "budget": budget,
            "block": block["offset"],
            "shown_bytes": before + shown,
            "left_bytes": len(text.encode()) - shown,
        }
        return page
    return page


def encode_cursor(ts: float, conv_id: str) -> str:
    """An opaque cursor for a list of conversations newest first (keyset: activity and id, so
    rows that change between pages are neither repeated nor skipped)."""
    raw = json.dumps([ts, conv_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        ts, conv_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(ts), str(conv_id)
    except (ValueError, TypeError) as exc:
        raise InputRejected(
            "not a cursor this server gave (pass the `cursor` of the previous page as it is)"
        ) from exc
