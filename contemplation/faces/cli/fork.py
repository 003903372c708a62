"""``contemplation fork``: a new conversation from blocks 1..N of another (see
:mod:`contemplation.faces.fork`). Loaded only when it runs (see
:mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import click

from contemplation.faces.cli.common import (
    CONVERSATION,
    ctx_home,
    ctx_settings,
    emit,
    json_option,
    lookup,
)


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.option(
    "--at",
    type=click.IntRange(min=1),
    help="The last block the fork takes, counted from 1 (default: the last finished block).",
)
@click.option("--topic", help="The fork's topic (default: the conversation's).")
@click.option(
    "--rerun",
    is_flag=True,
    help="Where block N awaits the model's answer (the agent's own block), answer it at once "
    "(default: the fork waits for your next message).",
)
@click.option(
    "--seat",
    metavar="LABEL",
    help="A panel: follow this model's line alone (its label, as in the log, or its model).",
)
@json_option('Print {"id", "path", "forked_from", "blocks", "waits_for_message", ...} as JSON.')
@click.pass_context
def fork(  # noqa: PLR0917 - click passes one argument per option
    ctx: click.Context,
    conversation: str,
    at: int | None,
    topic: str | None,
    rerun: bool,
    seat: str | None,
    as_json: bool,
) -> None:
    """Start a new conversation from blocks 1..N of CONVERSATION (archived ones too);
    prints its id. The next message to it continues from block N; no turn runs before it
    unless --rerun."""
    from contemplation.faces import fork as forking

    settings = ctx_settings(ctx)
    done = forking.fork(
        ctx_home(ctx),
        lookup(ctx, conversation),
        at=at,
        topic=topic,
        durable=settings.durability == "fsync",
        rerun=rerun,
        seat=seat,
    )
    if not as_json:
        where = " (archived)" if done.source.is_completed else ""
        held = (
            f"; it waits for your next message (fork --rerun answers block {done.block} at once)"
            if done.held
            else ""
        )
        click.echo(
            f"forked {done.source.id}{where} at block {done.block} of {done.source_blocks}{held}",
            err=True,
        )
    emit(done.as_dict(), as_json, done.conv.id)
