"""``contemplation retract`` and ``set-model``: going on after a turn that failed (an image
sent to a model that cannot see, a runaway reply): withdraw it, or move the conversation to
another model (see :func:`contemplation.faces.actions.retract` and :func:`~.actions.set_model`).
Loaded only when they run (see :mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import asyncio

import click

from contemplation.backends.catalog import refusal
from contemplation.errors import InputRejected
from contemplation.faces import actions
from contemplation.faces.cli.common import CONVERSATION, ctx_settings, emit, json_option, lookup
from contemplation.store.layout import read_metadata


@click.command()
@click.argument("conversation", type=CONVERSATION)
@json_option('Print {"conversation_id", "retracted", "block", "message"} as JSON.')
@click.pass_context
def retract(ctx: click.Context, conversation: str, as_json: bool) -> None:
    """Withdraw the last turn of CONVERSATION when it failed or was cancelled: the log keeps
    it, the model never sees it again, and nothing runs until your next message."""
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
@json_option('Print {"conversation_id", "model", "backend", "was"} as JSON.')
@click.pass_context
def set_model(
    ctx: click.Context, conversation: str, model: str, backend: str | None, as_json: bool
) -> None:
    """Send the next turns of CONVERSATION to MODEL (a turn in flight ends as it began)."""
    conv = lookup(ctx, conversation)
    s = ctx_settings(ctx)
    meta = read_metadata(conv)
    on = backend or (model if model in s.aliases else None) or (meta.backend if meta else "")
    if why := asyncio.run(refusal(s, on or s.default_backend, model)):
        raise InputRejected(why)  # an embedding or decision model (issue 39)
    done = actions.set_model(s, conv, model, backend)
    was = done["was"]
    human = (
        f"{conv.id}: the next turn goes to {done['model']} on {done['backend']} "
        f"(was {was['model']} on {was['backend']})"
    )
    emit({"conversation_id": conv.id} | done, as_json, human)
