"""``contemplation ledger``: where the tokens and the time went.

With a conversation: its turns (the last ones state.json lists, a page at a time) and its
sums per provider/model. Without: the sums over every conversation, archived included, read
from the index (one SQL query, never the folders), grouped by conversation, model or
provider, a page at a time; and the escalation ladder's books summed: the turns each rung
answered (the most answered first, --limit of them), escalated, and that reached the agent,
and the frontier tokens not spent.
"""

from __future__ import annotations

from typing import Any, cast

import click

from contemplation.faces.cli.common import CONVERSATION, ctx_home, emit, json_option, lookup
from contemplation.models import LedgerSums
from contemplation.protocol import escalation, paging
from contemplation.protocol import ledger as book
from contemplation.store.layout import read_state

TURNS_SHOWN = 20  # turns a page, unless --limit says


def _row(key: str, s: dict[str, Any]) -> str:
    return f"{key}  {book.line(LedgerSums.model_validate(s))}"


def _one(
    ctx: click.Context, conversation: str, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    conv = lookup(ctx, conversation)
    state = read_state(conv)
    kept = state.ledger if state is not None else None
    turns = list(kept.turns) if kept is not None else []
    if cursor:  # the turns before this one
        _, before = paging.decode_cursor(cursor)
        turns = [t for t in turns if t.turn < int(before)]
    n = limit or TURNS_SHOWN
    page, earlier = turns[-n:], turns[:-n]
    total = book.total(kept) if kept is not None else LedgerSums()
    data: dict[str, Any] = {
        "conversation": conv.id,
        "total": total.model_dump(),
        "by": {k: v.model_dump() for k, v in (kept.by if kept is not None else {}).items()},
        "turns": [t.model_dump() for t in page],
        "more": bool(earlier),
    }
    if earlier:
        data["cursor"] = paging.encode_cursor(0.0, str(page[0].turn))
    lines = [f"{conv.id}  {book.line(total)}"]
    lines += [f"  {k}  {book.line(v)}" for k, v in (kept.by if kept else {}).items()]
    lines += [f"  turn {t.turn}  {book.line(t)}" for t in page]
    if state is not None and state.ladder is not None:  # each rung's replies, and the causes
        data["ladder"] = state.ladder.model_dump()
        lines += [f"  {line}" for line in escalation.book_lines(state.ladder)]
    if earlier:
        lines.append(f"more: contemplation ledger {conv.id} --cursor {data['cursor']}")
    emit(data, as_json=as_json, human="\n".join(lines))


@click.command("ledger")
@click.argument("conversation", required=False, type=CONVERSATION)
@click.option(
    "--by",
    type=click.Choice(["conversation", "model", "provider"]),
    default="conversation",
    help="Sum over conversations grouped this way.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=500),
    default=None,
    help="A page; without a conversation, also the ladder's rungs listed.",
)
@click.option("--cursor", help="The next page: the cursor a page ended with.")
@json_option("Print the ledger as JSON: total, groups (or turns), more, cursor, ladder.")
@click.pass_context
def ledger(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str | None,
    by: str,
    limit: int | None,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Tokens sent, reused, recomputed and output, and time spent, per turn and summed."""
    if conversation is not None:
        _one(ctx, conversation, limit, cursor, as_json)
        return
    from contemplation.index import ledger as sums

    grouped = cast("sums.By", by)
    shown = limit or sums.RUNGS_SHOWN  # the ladder's rungs listed, the most answered first
    got = sums.summed(
        ctx_home(ctx), by=grouped, limit=limit or sums.LIMIT, cursor=cursor, rungs=shown
    )
    lines = [f"all  {_row('', got['total']).strip()}"]
    top = sums.MAX_LIMIT
    lines += escalation.sums_lines(
        got["ladder"], more=f"contemplation ledger --limit {top} lists up to {top}"
    )
    lines += [_row(g["key"], g) for g in got["groups"]]
    if got["more"]:
        lines.append(f"more: contemplation ledger --by {by} --cursor {got['cursor']}")
    emit(got, as_json=as_json, human="\n".join(lines))
