"""Pure: results an agent can hold. A page of blocks fits a byte budget and a token budget
(:data:`PAGE_TOKENS`, estimated by :func:`tokens`); a long block is cut at a line boundary,
and the cursor handed back continues exactly at the cut, so repeated calls read every block
once and nothing twice.

A cursor is a byte offset into the whole conversation at a block boundary (see
:mod:`contemplation.faces.reading`), or, after a cut inside a block, a position strictly inside it:
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
# Claude Code cuts an MCP tool result at 25,000 tokens. 64,000 bytes of ASCII are ~16,000
# tokens, but of CJK ~21,000 to 32,000 and of emoji up to 32,000: so a page also holds at most
# PAGE_TOKENS estimated tokens, leaving room for the snapshot around its blocks.
PAGE_TOKENS = 20_000


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def size(obj: Any) -> int:
    return len(dumps(obj).encode())


def text_tokens(text: str) -> int:
    """A conservative token estimate: an ASCII character a quarter token, every UTF-8 byte of
    any other character half a token (a CJK character 1.5, an emoji 2: tokenizers give them
    one to two each)."""
    raw = text.encode()
    ascii_n = len(text.encode("ascii", errors="ignore"))
    return -(-ascii_n // 4) + -(-(len(raw) - ascii_n) // 2)


def tokens(obj: Any) -> int:
    """:func:`text_tokens` of ``obj``'s compact JSON, as a result carries it."""
    return text_tokens(dumps(obj))


def continuation(block: dict[str, Any], shown: int) -> dict[str, Any]:
    """``block`` (a :func:`~contemplation.faces.reading.block_dict`) less the first ``shown`` bytes
    of its text, marked as the rest of a block cut before."""
    raw = str(block.get("text", "")).encode()
    rest = {k: v for k, v in block.items() if k != "parsed"}  # the whole answer's, not the rest's
    return rest | {"text": raw[shown:].decode("utf-8", errors="replace"), "continues": shown}


def cut_text(text: str, room: int, room_tokens: int | None = None) -> str:
    """The longest head of ``text`` of at most ``room`` bytes (and ``room_tokens`` estimated
    tokens) that ends at a line boundary (a single line longer than that is cut at a
    character boundary, never inside one)."""
    raw = text.encode()
    if len(raw) <= room and (room_tokens is None or text_tokens(text) <= room_tokens):
        return text
    if room_tokens is not None:  # any text of 2 * (t - 1) bytes is at most t tokens
        room = min(room, max(2 * (room_tokens - 1), 1))
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
    budget_tokens: int = PAGE_TOKENS,
) -> Page:
    """Blocks of ``offered`` (each with the bytes of its text already shown before this
    page) while they fit ``budget`` bytes and ``budget_tokens`` estimated tokens; ``keep``
    says which are shown at all (the others are passed over, free). The first block that does
    not fit ends the page: cut inside when it is the first one shown, else left whole for the
    next call."""
    page = Page()
    used, used_tokens = 2, 1  # the list's brackets, and a comma before every block but the first
    for block, before in offered:
        if not keep(block):
            continue
        text_json = dumps(block)
        need = len(text_json.encode()) + (1 if page.blocks else 0)
        need_tokens = text_tokens(text_json) + (1 if page.blocks else 0)
        if used + need <= budget and used_tokens + need_tokens <= budget_tokens:
            page.blocks.append(block)
            used += need
            used_tokens += need_tokens
            continue
        text = str(block.get("text", ""))
        limits = {"budget": budget, "budget_tokens": budget_tokens}
        if page.blocks:  # the next call starts at this block
            page.cursor = int(block["offset"]) + (1 + before if before else 0)
            page.cut = {"reason": "budget", **limits, "next_block": block["offset"]}
            return page
        # a structured reply cut in pieces: its text is the answer, not a parsed copy
        part = {k: v for k, v in block.items() if k != "parsed"}
        need = size(part)  # the first block of the page: no comma
        room = max(budget - used - (need - size(text)), 256)
        room_tokens = max(budget_tokens - used_tokens - (tokens(part) - tokens(text)), 128)
        head = cut_text(text, room, room_tokens)
        for _ in range(8):  # the JSON form escapes (a newline is two bytes): shrink to fit
            shown_part = part | {"text": head, "cut": True}
            over = size(shown_part) - (budget - used)
            over_tokens = tokens(shown_part) - (budget_tokens - used_tokens)
            if (over <= 0 and over_tokens <= 0) or room <= 256:
                break
            room = max(len(head.encode()) - max(over, 2 * over_tokens, 1), 256)
            head = cut_text(text, room, room_tokens)
        shown = len(head.encode())
        page.blocks.append(part | {"text": head, "cut": True})
        page.cursor = int(block["offset"]) + 1 + before + shown
        page.cut = {
            "reason": "budget",
            **limits,
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
