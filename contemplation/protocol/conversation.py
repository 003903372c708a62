"""Pure: what a conversation needs next, derived from its parsed log alone.

The log is the source of truth; ``state.json`` only journals writes and caches. A turn is
due when the agent side spoke last (a message, or answers to every pending need) or when the
last model reply was cut off (``=== INTERRUPTED ===``). ERROR and CANCELLED markers stop the
retrying until the agent writes again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from contemplation.models import Block, BlockKind, MarkerKind

_STOPPERS = {MarkerKind.ERROR, MarkerKind.CANCELLED}
_UNFINISHED = {MarkerKind.INTERRUPTED, MarkerKind.ERROR, MarkerKind.CANCELLED}
# the agent's own word on the turn that ends here: no turn is due until it writes again
_HOLDS = {MarkerKind.FORKED, MarkerKind.RETRACTED}


def whole(block: Block) -> bool:
    """A block that belongs in the history (not a cut-off, failed or cancelled reply)."""
    if block.kind is BlockKind.AGENT:
        return True
    return not any(k in _UNFINISHED for k, _ in block.markers)


def last_marker(block: Block) -> MarkerKind | None:
    for kind, _ in reversed(block.markers):
        if kind in _UNFINISHED or kind in _HOLDS or kind is MarkerKind.COMPLETE:
            return kind
    return None


def retracted(blocks: tuple[Block, ...]) -> set[int]:
    """The indices of the blocks the agent withdrew: each ``RETRACTED`` marker withdraws
    the turn that ends with its block, from the agent's own message that began it."""
    out: set[int] = set()
    start = 0
    for i, b in enumerate(blocks):
        if b.kind is BlockKind.AGENT and b.response_to is None:
            start = i
        if any(k is MarkerKind.RETRACTED for k, _ in b.markers):
            out.update(range(start, i + 1))
    return out


@dataclass(frozen=True, slots=True)
class Next:
    action: Literal["idle", "turn", "needs", "complete", "stopped"]
    needs: tuple[str, ...] = ()  # unanswered needs (action == "needs")
    reason: str = ""
    rounds: int = 0  # model replies since the agent's last own message (need rounds)


def unanswered(blocks: tuple[Block, ...]) -> tuple[Block | None, tuple[str, ...]]:
    """The last whole model block and its needs that have no RESPONSE yet."""
    answered: set[str] = set()
    for b in reversed(blocks):
        if b.kind is BlockKind.AGENT:
            if b.response_to is None:
                return None, ()
            answered.update(b.responds)
            continue
        if not whole(b):
            continue
        if b.complete:
            return b, ()
        seen: set[str] = set()
        missing = []
        for n in b.needs:
            if n not in answered and n not in seen:
                missing.append(n)
                seen.add(n)
        return b, tuple(missing)
    return None, ()


def need_id(block: Block | None, need: str) -> str:
    """The id of one NEED line of one reply: the same at every step, on every face and after
    a restart, and new when a later reply asks again (so an approval given ``once`` is once)."""
    where = f"{block.offset}|{block.timestamp}" if block is not None else "-"
    return hashlib.sha256(f"{where}|{need}".encode()).hexdigest()[:12]


def turn_start(blocks: tuple[Block, ...]) -> int:
    """Offset of the agent's own message that began the current turn (0 when none)."""
    for b in reversed(blocks):
        if b.kind is BlockKind.AGENT and b.response_to is None:
            return b.offset
    return 0


def need_rounds(blocks: tuple[Block, ...]) -> int:
    rounds = 0
    for b in reversed(blocks):
        if b.kind is BlockKind.AGENT and b.response_to is None:
            break
        if b.kind is BlockKind.MODEL and whole(b) and b.needs:
            rounds += 1
    return rounds


def next_action(blocks: tuple[Block, ...]) -> Next:
    if not blocks:
        return Next("idle", reason="empty log")
    last = blocks[-1]
    mark = last_marker(last)
    if mark in _STOPPERS:
        return Next("stopped", reason=mark.value.lower() if mark else "")
    if mark is MarkerKind.FORKED:
        return Next("idle", reason="a fork waits for the next message")
    if mark is MarkerKind.RETRACTED:
        return Next("idle", reason="the agent withdrew the last turn")
    if last.kind is BlockKind.MODEL:
        if mark is MarkerKind.INTERRUPTED:
            return Next("turn", reason="the last reply was cut off", rounds=need_rounds(blocks))
        if last.complete:
            return Next("complete")
        if last.needs:
            _, missing = unanswered(blocks)
            return Next("needs", needs=missing, rounds=need_rounds(blocks))
        return Next("idle", reason="answered")
    if last.truncated:
        return Next("idle", reason="the last block is still being written")
    if last.response_to is not None:
        model_block, missing = unanswered(blocks)
        if model_block is not None and missing:
            return Next("needs", needs=missing, rounds=need_rounds(blocks))
    return Next("turn", rounds=need_rounds(blocks))


def still_due(blocks: tuple[Block, ...]) -> bool:
    """A turn decided by the step is still due once the lock is taken again (nobody answered
    or cancelled meanwhile)."""
    return next_action(blocks).action == "turn"
