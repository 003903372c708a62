"""How far back a turn reads a long conversation's history.

The daemon holds the rotated segments of a log as bare blocks (no text: see
:class:`~contemplation.store.logview.LogView`), so a conversation of any size costs a few hundred
bytes a block. A turn needs the text of the newest blocks only: what the model's window can
hold, and what the one summary call can be shown of the rest. :func:`reach` reads them back,
newest first, until they are surely enough, and tells the turn where they start:

1. the history the request keeps is never more than the window, even with every old tool
   output made a stub: blocks are read until a lower bound of their cost (each message's
   :data:`~contemplation.prompt.budget.PER_MESSAGE`, plus its characters at
   :data:`~contemplation.prompt.budget.MIN_RATIO` unless it may be a stub) passes the window;
2. the summary call is shown the newest messages that fit its window, at least
   :data:`~contemplation.prompt.budget.MIN_ENTRY_CHARS` each: blocks are read on until, past
   step 1, more than that many messages and more characters than the window holds are in.

What :func:`~contemplation.prompt.budget.plan` makes of the blocks read is then what it would make
of the whole log (the count of the older messages, left unread, comes from their bare
blocks). A history whose older part is longer than ``SUMMARY_READ_CHARS`` gives the summary
call its newest ``SUMMARY_READ_CHARS`` only.
"""

from __future__ import annotations

from contemplation.models import Block, BlockKind, MarkerKind
from contemplation.prompt import budget, prompts
from contemplation.protocol.conversation import whole
from contemplation.protocol.logformat import RESPONSE_PREFIX, TOOL_CALL_OPEN
from contemplation.protocol.structured import RETRY_PREFIX
from contemplation.store.logview import LogView

SUMMARY_READ_CHARS = 16 << 20  # at most this much text is read for the summary call


def reach(
    view: LogView, blocks: tuple[Block, ...], window: int, ratio: float = budget.MIN_RATIO
) -> tuple[tuple[Block, ...], int]:
    """``blocks`` (the view's result) with the text of the newest ones read back, and the
    index of the first of them: the history the turn builds starts there."""
    bare = view.bare_count
    if bare == 0:
        return blocks, 0
    ratio = min(ratio, budget.MIN_RATIO)
    want_count = int(window / (budget.MIN_ENTRY_CHARS * ratio)) + 2
    kept = 0.0  # step 1's lower bound, in tokens
    chars = count = 0  # step 2's characters and messages
    out = list(blocks)

    def enough() -> bool:
        return chars > SUMMARY_READ_CHARS or (
            kept > window and chars * ratio > window and count >= want_count
        )

    def take(b: Block) -> None:
        nonlocal kept, chars, count
        n, least = prompts.message_count((b,)), _least_chars(b)
        if kept <= window:
            stub = b.kind is BlockKind.AGENT and b.text.startswith(RESPONSE_PREFIX)
            kept += n * budget.PER_MESSAGE + (0 if stub else least * ratio)
        else:
            chars, count = chars + least, count + n

    for i in range(len(blocks) - 1, bare - 1, -1):
        take(blocks[i])
        if enough():
            return _with_spec(view, tuple(out), i), i
    first = bare
    for i, b in view.read_back(bare):
        out[i], first = b, i
        take(b)
        if enough():
            break
    return _with_spec(view, tuple(out), first), first


def _least_chars(b: Block) -> int:
    """At least how many characters the message(s) of ``b`` hold."""
    if b.kind is BlockKind.MODEL and not whole(b):
        return 0
    if TOOL_CALL_OPEN in b.text or "SCHEMA" in b.text:  # its text may go elsewhere
        return 0
    return len(b.text.strip("\n"))


def _with_spec(view: LogView, blocks: tuple[Block, ...], first: int) -> tuple[Block, ...]:
    """``blocks`` with the agent's last own message read back too, and the replies after it
    a retry marked: what :func:`~contemplation.protocol.structured.spec_for` reads."""
    own = next(
        (
            i
            for i in range(len(blocks) - 1, -1, -1)
            if blocks[i].kind is BlockKind.AGENT and blocks[i].response_to is None
        ),
        -1,
    )
    if own < 0 or own >= first:
        return blocks
    wanted = [own] + [
        i
        for i in range(own + 1, first)
        if any(
            k is MarkerKind.INTERRUPTED and d.startswith(RETRY_PREFIX) for k, d in blocks[i].markers
        )
    ]
    return view.with_texts(blocks, wanted)
