"""``contemplation related CONV``: the conversations nearest in meaning to one (the semantic
extra, :mod:`contemplation.index.fusion`); CONV as every command takes it: an id, a unique id
prefix or a topic.

    contemplation related CONV [--active] [--limit N] [--cursor NEXT] [--json]
"""

from __future__ import annotations

import json

import click

from contemplation.base.terminal import safe
from contemplation.faces.cli.common import ctx_home, ctx_light, json_option, lookup


@click.command()
@click.argument("conversation")
@click.option("--active", "active_only", is_flag=True, help="Leave archived ones out.")
@click.option(
    "--limit", type=click.IntRange(min=1, max=200), default=10, show_default=True, help="Hits."
)
@click.option("--cursor", default=None, help="The next page: the cursor it printed.")
@json_option("One JSON object per conversation, a line each.")
@click.pass_context
def related(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str,
    active_only: bool,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """The conversations nearest in meaning to CONVERSATION (an id, a unique id prefix or a
    topic), nearest first."""
    from contemplation.index import embedder, fusion

    conv = lookup(ctx, conversation)
    embedder.configure(*ctx_light(ctx).embed)  # [semantic]: the person's embedding server
    page = fusion.related(ctx_home(ctx), conv.id, limit, cursor=cursor, archived=not active_only)
    for h in page.hits:
        if as_json:
            click.echo(json.dumps(h.as_dict(), ensure_ascii=False))
        else:
            where = f"{h.conv}  #{h.block} {h.sender} {h.time}"
            where += f"  ({h.relevance})" if h.relevance else ""
            click.echo(safe(where + ("  (archived)" if h.archived else "") + f"\n  {h.topic}"))
    if not page.hits:
        click.echo(f"nothing related to {conversation} yet", err=True)
    if page.next:
        click.echo(f"more: --cursor {page.next}", err=True)
