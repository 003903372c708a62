"""``contemplation retract``, ``set-model`` and ``continue``: going on after a turn that
failed (an image sent to a model that cannot see, a runaway reply): withdraw it, or move the
conversation to another model (see :func:`contemplation.faces.actions.retract` and
:func:`~.actions.set_model`), or after a reply that stopped before its end: have the model
go on (:func:`~.actions.go_on`).
Loaded only when they run (see :mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import asyncio
import sys

import click

from contemplation.backends.catalog import refusal
from contemplation.errors import InputRejected
from contemplation.faces import actions
from contemplation.faces.cli import wait as following
from contemplation.faces.cli.common import (
    CONVERSATION,
    EXIT_CODES,
    ctx_settings,
    emit,
    json_option,
    lookup,
)
from contemplation.faces.cli.conv import TIMEOUT, WAIT, WAIT_JSON
from contemplation.faces.reading import Reader
from contemplation.store.layout import Home, read_metadata


@click.command()
@click.argument("conversation", type=CONVERSATION)
@json_option('Print {"conversation_id", "retracted", "block", "message"} as JSON.')
@click.pass_context
def retract(ctx: click.Context, conversation: str, as_json: bool) -> None:
    """Withdraw the last turn of CONVERSATION when it failed or was cancelled: the log keeps
    it, the model never sees it again, and nothing runs until your next message. In a panel,
    each seat whose turn failed has it withdrawn from its own line; the other seats' answers
    stand."""
    conv = lookup(ctx, conversation)
    done = actions.retract(ctx_settings(ctx), conv)
    human = (
        f"withdrew the last turn of {conv.id} (block {done['block']}: {done['message']}); "
        "the model will not see it"
    )
    emit({"conversation_id": conv.id} | done, as_json, human)


@click.command("set-model")
@click.argument("conversation", type=CONVERSATION)
@click.argument("model")
@click.option("--backend", "-b", help="The backend or provider (default: the conversation's).")
@click.option(
    "--seat",
    metavar="LABEL",
    help="In a panel: the seat to move (its label, as its replies' headers name it).",
)
@json_option('Print {"conversation_id", "model", "backend", "seat", "was"} as JSON.')
@click.pass_context
def set_model(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str,
    model: str,
    backend: str | None,
    seat: str | None,
    as_json: bool,
) -> None:
    """Send the next turns of CONVERSATION to MODEL (a turn in flight ends as it began).
    In a panel, --seat LABEL moves that seat (it keeps its label and its line of the log)."""
    conv = lookup(ctx, conversation)
    s = ctx_settings(ctx)
    meta = read_metadata(conv)
    was = meta.backend if meta else ""
    if meta is not None and seat is not None:
        found = [x for x in meta.seats() if x.label == seat.strip().upper()]
        was = (found[0].backend if found else "") or was
    on = backend or (model if model in s.aliases else None) or was
    if why := asyncio.run(refusal(s, on or s.default_backend, model)):
        raise InputRejected(why)  # an embedding or decision model
    done = actions.set_model(s, conv, model, backend, seat=seat)
    before = f"(was {done['was']['model']} on {done['was']['backend']})"
    human = f"{conv.id}: the next turn goes to {done['model']} on {done['backend']} {before}"
    if done.get("seat"):
        human = (
            f"{conv.id}: seat {done['seat']} answers with {done['model']} on {done['backend']} "
            f"from the next message {before}"
        )
    emit({"conversation_id": conv.id} | done, as_json, human)


@click.command("continue", epilog=EXIT_CODES)
@click.argument("conversation", type=CONVERSATION)
@WAIT
@TIMEOUT
@WAIT_JSON
@click.pass_context
def continue_(
    ctx: click.Context, conversation: str, wait: bool, timeout: float, as_json: bool
) -> None:
    """Have the model go on with its last reply where it stopped (a token limit, a loop).

    A GO ON line ends the log; the next turn sends that reply as the model's own words and
    the model carries on from them, in a block of its own (no message in your name). With
    --wait the continuation streams to stdout; exit codes as `send --wait` (5: stopped again)."""
    s = ctx_settings(ctx)
    conv = lookup(ctx, conversation)
    done = actions.go_on(s, conv)
    if not wait:
        human = f"{conv.id}: the model goes on with its reply (block {done['block']})"
        emit({"conversation_id": conv.id} | done, as_json, human)
        return
    reader = Reader(Home(s.home))
    ex = following.Exchange(reader.boundary(conv))
    following.note_no_daemon(reader.home)
    sys.exit(following.follow(reader, conv, ex, timeout, as_json=as_json))
