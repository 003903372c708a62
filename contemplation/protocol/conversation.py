"""Pure: what a conversation needs next, derived from its parsed log alone.

The log is the source of truth; ``state.json`` only journals writes and caches. A turn is
due when the agent side spoke last (a message, or answers to every pending need) or when the
last model reply was cut off (``=== INTERRUPTED ===``). ERROR and CANCELLED markers stop the
retrying until the agent writes again.

A lookup that waits for the person's approval (``state.json`` → ``pending_approvals``, not yet
decided in ``metadata.json`` → ``approvals``: :func:`awaiting`) is answered by its tool once
decided, never by text: a ``RESPONSE TO NEED`` block for it, written by hand into the log or
dropped in ``inbox/``, does not count (``held``), and the daemon says so with a
:data:`DISOWNED` NOTE after it, which keeps it from counting for that lookup for good (the tool's
answer after the decision, written after the NOTE, does).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from contemplation.protocol.escalation import panel_hidden, seats_pending
from contemplation.values import Block, BlockKind, MarkerKind

if TYPE_CHECKING:  # the models load where the documents are, not to read a log
    from contemplation.models import Metadata, State

_STOPPERS = {MarkerKind.ERROR, MarkerKind.CANCELLED}
_UNFINISHED = {MarkerKind.INTERRUPTED, MarkerKind.ERROR, MarkerKind.CANCELLED, MarkerKind.ESCALATED}
# the agent's own word on the turn that ends here: no turn is due until it writes again
_HOLDS = {MarkerKind.FORKED, MarkerKind.RETRACTED}
_HELD = {
    MarkerKind.FORKED: "a fork waits for the next message",
    MarkerKind.RETRACTED: "the agent withdrew the last turn",
}
#: the NOTE after a RESPONSE TO NEED block written for a lookup that waits for approval: the
#: blocks before it do not answer that lookup (its id follows)
DISOWNED = "the RESPONSE TO NEED above does not answer lookup"
_DISOWNED_RE = re.compile(re.escape(DISOWNED) + r" ([0-9a-f]{12})\b")
NONE: frozenset[str] = frozenset()


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


def goes_on(block: Block) -> bool:
    """A model block the agent asked the model to go on with (``continue``): its last marker
    is ``GO ON``, and the next reply carries on from its words."""
    return (
        block.kind is BlockKind.MODEL
        and bool(block.markers)
        and (block.markers[-1][0] is MarkerKind.GO_ON)
    )


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
        elif any(k is MarkerKind.ESCALATED for k, _ in b.markers):
            # the failed reply and the replies it went on with: the next rung answers afresh
            j = i - 1
            while j > start and blocks[j].kind is BlockKind.MODEL and goes_on(blocks[j]):
                out.add(j)
                j -= 1
    return out | panel_hidden(blocks)  # a panel rung's seats: each answers afresh


@dataclass(frozen=True, slots=True)
class Marks:
    """Where a conversation's blocks stand in the model's history (:func:`history_marks`),
    by index: only the few that are not plain history are named."""

    left_out: AbstractSet[int]  # withdrawn, or a model block cut off or failed (not cancelled)
    cancelled: AbstractSet[int]  # the turn after it was cancelled by the agent (CANCELLED)
    carried: AbstractSet[int]  # a model block that goes on from the reply before it


def history_marks(blocks: tuple[Block, ...]) -> Marks:
    """The blocks' places in the history, read in one pass (see
    :func:`contemplation.prompt.prompts.history_blocks`): a withdrawn turn is left out whole,
    and a model block cut off or failed is left out unless the agent cancelled its turn (its
    words stay, with a note)."""
    left_out = set(retracted(blocks))
    cancelled: set[int] = set()
    carried: set[int] = set()
    for i, b in enumerate(blocks):
        if b.markers and last_marker(b) is MarkerKind.CANCELLED:
            cancelled.add(i)
        elif b.kind is BlockKind.MODEL and not whole(b):
            left_out.add(i)
        if i and b.kind is BlockKind.MODEL and goes_on(blocks[i - 1]):
            carried.add(i)
    return Marks(left_out, cancelled, carried)


@dataclass(frozen=True, slots=True)
class Next:
    action: Literal["idle", "turn", "needs", "complete", "stopped"]
    needs: tuple[str, ...] = ()  # unanswered needs (action == "needs")
    reason: str = ""
    rounds: int = 0  # model replies since the agent's last own message (need rounds)


def disowned(block: Block) -> Iterator[str]:
    """The lookups (ids) a :data:`DISOWNED` NOTE on ``block`` says the blocks up to it do not
    answer."""
    for kind, text in block.markers:
        if kind is MarkerKind.NOTE and (m := _DISOWNED_RE.match(text)) is not None:
            yield m.group(1)


def unanswered(
    blocks: tuple[Block, ...], held: Collection[str] = NONE
) -> tuple[Block | None, tuple[str, ...]]:
    """The last whole model block and its needs that have no RESPONSE yet. An answer to a
    lookup in ``held`` (waiting for approval, :func:`awaiting`), or to one a later
    :data:`DISOWNED` NOTE names, is none."""
    answers: list[tuple[tuple[str, ...], frozenset[str]]] = []  # each block's, what it may not
    voided: set[str] = set()
    for b in reversed(blocks):
        voided.update(disowned(b))
        if b.kind is BlockKind.AGENT:
            if b.response_to is None:
                return None, ()
            answers.append((b.responds, frozenset(voided)))
            continue
        if not whole(b):
            continue
        if b.complete:
            return b, ()
        answered: set[str] = set()
        for responds, void in answers:
            barred = void.union(held) if held or void else NONE
            answered.update(n for n in responds if not barred or need_id(b, n) not in barred)
        seen: set[str] = set()
        missing = []
        for n in b.needs:
            if n not in answered and n not in seen:
                missing.append(n)
                seen.add(n)
        return b, tuple(missing)
    return None, ()


def awaiting(state: State | None, meta: Metadata | None) -> frozenset[str]:
    """The lookups (ids) that wait for the person's approval: asked (``pending_approvals``)
    and not decided yet (``approvals``: its own decision, or an ``always`` one for the same
    tool and arguments). Only the tool answers them, after the decision."""
    if state is None or not state.pending_approvals:
        return NONE
    given = meta.approvals() if meta is not None else []
    own = {d.request for d in given}
    always = [(d.tool, d.arguments) for d in given if d.decision == "always"]
    return frozenset(
        r.id
        for r in state.pending_approvals
        if r.id not in own and (r.tool, r.arguments) not in always
    )


def answered_by_hand(blocks: tuple[Block, ...], held: Collection[str]) -> list[tuple[str, str]]:
    """The lookups in ``held`` that an agent block since the last whole model reply answers,
    with no :data:`DISOWNED` NOTE yet: (id, need) each, once."""
    model_block, _ = unanswered(blocks)
    if model_block is None or not held:
        return []
    noted: set[str] = set()
    out: dict[str, str] = {}
    for b in reversed(blocks):
        if b is model_block:
            break
        noted.update(disowned(b))
        for n in b.responds:
            rid = need_id(model_block, n)
            if rid in held and rid not in noted:
                out.setdefault(rid, n)
    return list(out.items())


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
        if any(k is MarkerKind.ESCALATED for k, _ in b.markers):
            break  # the next rung counts its own rounds
        if b.kind is BlockKind.MODEL and whole(b) and b.needs:
            rounds += 1
    return rounds


def next_action(blocks: tuple[Block, ...], held: Collection[str] = NONE) -> Next:
    """What is due, from the log; ``held``: the lookups waiting for approval (:func:`awaiting`),
    which no agent block answers."""
    if not blocks:
        return Next("idle", reason="empty log")
    last = blocks[-1]
    mark = last_marker(last)
    if mark is MarkerKind.ESCALATED:  # the ladder's next rung, or the agent at its top
        return _escalated(blocks, last)
    if mark in _STOPPERS:
        return Next("stopped", reason=mark.value.lower() if mark else "")
    if mark in _HOLDS:
        return Next("idle", reason=_HELD[mark])
    if last.kind is BlockKind.MODEL:
        return _after_reply(blocks, last, mark, held)
    if last.truncated:
        return Next("idle", reason="the last block is still being written")
    if last.response_to is not None:
        model_block, missing = unanswered(blocks, held)
        if model_block is not None and missing:
            return Next("needs", needs=missing, rounds=need_rounds(blocks))
    return Next("turn", rounds=need_rounds(blocks))


def _after_reply(
    blocks: tuple[Block, ...], last: Block, mark: MarkerKind | None, held: Collection[str]
) -> Next:
    """What is due after a model's reply (the log's last block)."""
    if mark is MarkerKind.INTERRUPTED:
        return Next("turn", reason="the last reply was cut off", rounds=need_rounds(blocks))
    if goes_on(last):  # `contemplation continue`: the reply goes on in a block of its own
        return Next("turn", reason="the agent asked the model to go on")
    if last.complete:
        return Next("complete")
    if last.needs:
        _, missing = unanswered(blocks, held)
        return Next("needs", needs=missing, rounds=need_rounds(blocks))
    if seats_pending(blocks):  # the escalation ladder's panel rung: its next seat
        return Next("turn", reason="the next seat of the panel rung")
    return Next("idle", reason="answered")


def _escalated(blocks: tuple[Block, ...], last: Block) -> Next:
    """A turn the ladder sent up (its last marker ``ESCALATED``): the next rung's turn is due,
    or, when it names the agent (the ladder's top), nothing until the agent writes."""
    for kind, text in reversed(last.markers):
        if kind is MarkerKind.ESCALATED and text.rstrip().endswith("→ agent"):
            return Next("stopped", reason="escalated to the agent")
    return Next("turn", reason="escalated to the next rung", rounds=need_rounds(blocks))


def still_due(blocks: tuple[Block, ...], held: Collection[str] = NONE) -> bool:
    """A turn decided by the step is still due once the lock is taken again (nobody answered
    or cancelled meanwhile, and the message taken is no answer to a lookup in ``held``)."""
    return next_action(blocks, held).action == "turn"
