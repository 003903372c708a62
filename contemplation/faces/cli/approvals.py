"""``contemplation approvals``: the decisions made about lookups, who made each and when, and
``approvals revoke ID``, which takes an ``always`` back (:mod:`contemplation.faces.decisions`)."""

from __future__ import annotations

import click

from contemplation.base import acting
from contemplation.base.terminal import safe
from contemplation.faces import decisions
from contemplation.faces.cli.common import CONVERSATION, ctx_home, ctx_settings, emit, json_option
from contemplation.faces.cli.common import lookup as find_conv


@click.group("approvals", invoke_without_command=True)
@click.option("-c", "--conversation", type=CONVERSATION, help="Only this conversation's.")
@click.option("--standing", is_flag=True, help="Only the 'always' decisions still in force.")
@click.option(
    "--limit",
    type=click.IntRange(1, decisions.MAX_LIMIT),
    default=decisions.DEFAULT_LIMIT,
    show_default=True,
    help="At most this many (newest first).",
)
@click.option("--cursor", help="Where the previous page ended (its last line says).")
@json_option('Print {"decisions": [...], "cursor", "total"}.')
@click.pass_context
def approvals(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str | None,
    standing: bool,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """The decisions about lookups (once, always, reject): who made each, when, for which
    tool and arguments. An 'always' stands until revoked: `approvals revoke ID`."""
    if ctx.invoked_subcommand is not None:
        return
    only = find_conv(ctx, conversation) if conversation else None
    got = decisions.page(ctx_home(ctx), only=only, cursor=cursor, limit=limit, standing=standing)
    lines = [decisions.line(d) for d in got["decisions"]] or ["no decisions"]
    if got["cursor"]:
        shown = len(got["decisions"])
        lines.append(
            safe(
                f"{shown} of {got['total']} shown; the next page: contemplation approvals "
                f"--cursor '{got['cursor']}'"
            )
        )
    emit(got, as_json, "\n".join(lines))


@approvals.command("revoke")
@click.argument("decision_id")
@click.option("-c", "--conversation", type=CONVERSATION, help="The conversation it is in.")
@json_option("Print the revoked decision.")
@click.pass_context
def revoke(ctx: click.Context, decision_id: str, conversation: str | None, as_json: bool) -> None:
    """Revoke an 'always' (its id, or a unique prefix): the next such lookup is asked again."""
    only = find_conv(ctx, conversation) if conversation else None
    who = acting.here()
    done = decisions.revoke(
        ctx_settings(ctx),
        decision_id,
        only=only,
        face="agent-cli" if who.is_agent else "cli",
        agent=who.agent,
    )
    emit(done, as_json, "revoked: " + decisions.line(done))
