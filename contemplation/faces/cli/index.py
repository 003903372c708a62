"""``contemplation search``, ``reindex`` and ``prune``: the derived index of every conversation
(:mod:`contemplation.index.db`) and what it makes cheap.

    contemplation search QUERY [--all] [--model M] [--status S] [--since DATE] [--limit N] [--json]
                         [--mode words|meaning|both] [--cursor NEXT]
    contemplation reindex [--check] [--no-meaning]
    contemplation prune --older-than 90d [--dry-run] [--json]
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING

import click

from contemplation.base.exits import EXIT_ERROR
from contemplation.base.terminal import safe
from contemplation.faces.cli import show
from contemplation.faces.cli.common import ctx_home, ctx_light, emit, json_option
from contemplation.store.layout import Home

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar


@click.command()
@click.argument("query")
@click.option("--all", "include_archived", is_flag=True, help="Archived conversations too.")
@click.option("--thinking", is_flag=True, help="Search the models' thinking too.")
@click.option("--model", "-m", default="", help="Only this model's (NAME or BACKEND/NAME).")
@click.option("--status", "status", default="", help="Only conversations in this status.")
@click.option("--since", default="", help="Only blocks from this day on (YYYY-MM-DD[ HH:MM]).")
@click.option(
    "--limit", type=click.IntRange(min=1, max=200), default=20, show_default=True, help="Hits."
)
@click.option(
    "--mode",
    type=click.Choice(["words", "meaning", "both"]),
    default=None,
    help="Rank by words, by meaning or both (default: both with the semantic extra).",
)
@click.option("--cursor", default=None, help="The next page: the cursor a search printed.")
@json_option("One JSON object per hit, a line each.")
@click.pass_context
def search(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    query: str,
    include_archived: bool,
    thinking: bool,
    model: str,
    status: str,
    since: str,
    limit: int,
    mode: str | None,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Search the text of every conversation (words, "a phrase", OR, NOT, prefix* of 3
    letters or more); best matches first, the newest conversation first on ties. A search
    runs at most search_seconds (10 s): then it says it was cut. With the semantic extra it
    ranks by meaning too (fused ranks)."""
    from contemplation.index import embedder, fusion
    from contemplation.index.search import Filters, since_bound

    filters = Filters(
        archived=include_archived,
        thinking=thinking,
        model=model,
        status=status.strip().lower(),
        since=since_bound(since),
    )
    s = ctx_light(ctx)  # the home and search_seconds: no settings model (a read command)
    embedder.configure(*s.embed)  # [semantic]: the person's embedding server, if any
    page = fusion.search(
        Home(s.home),
        query,
        filters,
        limit,
        mode=mode or "",
        cursor=cursor,
        seconds=s.search_seconds,
    )
    found, hits = page.found, page.hits
    if as_json:
        for h in hits:
            click.echo(json.dumps(h.as_dict(), ensure_ascii=False))
    if page.weak and hits:  # by meaning nothing is close: said before the nearest
        click.echo(f"nothing close to {query!r}; nearest:", err=True)
    if not hits and not found.cut:
        more = found.archived_line()
        click.echo(
            f"no block of an active conversation matches {query!r}; {more}: search --all to "
            "see them"
            if more
            else f"no block matches {query!r}",
            err=True,
        )
    for h in () if as_json else hits:
        where = f"{h.conv}  #{h.block} {h.sender} {h.time}" + ("  (archived)" if h.archived else "")
        where += f"  ({h.relevance})" if h.relevance else ""
        click.echo(safe(f"{where}\n  {h.topic}\n  {h.snippet}"))
    if page.next:
        click.echo(f"more: --cursor {page.next}", err=True)
    if page.note:
        click.echo(page.note, err=True)
    if page.unembedded:
        click.echo(page.unembedded_line(), err=True)
    if found.cut:  # after what was found: the last line a person reads
        click.echo(found.cut, err=True)


@click.command()
@click.option("--check", is_flag=True, help="Say what the index lacks; write nothing.")
@click.option(
    "--no-meaning",
    "no_meaning",
    is_flag=True,
    help="Leave the vectors of meaning to the daemon (semantic extra).",
)
@json_option('With --check: {"missing", "gone", "changed"} as JSON.')
@click.pass_context
def reindex(ctx: click.Context, check: bool, no_meaning: bool, as_json: bool) -> None:
    """Make the search index anew from the folders (it is derived: safe at any time)."""
    from contemplation.index import db

    home = ctx_home(ctx)
    if check:
        found = db.drift(home)
        human = "\n".join(
            f"{k}: {len(v)}" + (f" ({', '.join(v[:5])})" if v else "") for k, v in found.items()
        )
        emit(found, as_json, human)
        if any(found.values()):
            sys.exit(EXIT_ERROR)
        return
    with contextlib.ExitStack() as stack:
        bars: list[ProgressBar[int]] = []  # shown once the index is known to be writable

        def step(done: int, total: int) -> None:
            if not bars:
                bar = click.progressbar(length=total, label="indexing", file=sys.stderr)
                bars.append(stack.enter_context(bar))
            bars[0].update(done - bars[0].pos)

        count = db.rebuild(home, step)
    click.echo(f"indexed {count} conversation(s) into {db.db_path(home)}")
    if not no_meaning:
        from contemplation.index import embedder

        embedder.configure(*ctx_light(ctx).embed)  # [semantic]: the daemon's model too
        _embed_all(home)


def _embed_all(home: Home) -> None:
    """The vectors of meaning of every conversation (with the semantic extra), with a bar."""
    import time

    from contemplation.index import db, embedder

    if not embedder.available():
        return
    from contemplation.index import semantic  # numpy: the extra's

    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        bars: list[ProgressBar[int]] = []

        def step(done: int, total: int) -> None:
            if not bars:
                bar = click.progressbar(length=total, label="embedding", file=sys.stderr)
                bars.append(stack.enter_context(bar))
            bars[0].update(done - bars[0].pos)

        done = db.read(home, lambda conn: semantic.embed_pending(conn, None, step), fallback=False)
    took = time.monotonic() - started
    click.echo(f"embedded {done.embedded} text(s) for search by meaning in {took:.1f} s", err=True)


@click.command()
@click.option(
    "--older-than", "older_than", required=True, help="An age: 90d, 12h or 2w (a number: days)."
)
@click.option("--dry-run", is_flag=True, help="Say what would go; delete nothing.")
@json_option('Print {"removed": [{id, last_activity, bytes}], "freed_bytes", "dry_run"}.')
@click.pass_context
def prune(ctx: click.Context, older_than: str, dry_run: bool, as_json: bool) -> None:
    """Delete archived conversations whose last activity is older than an age (never an active
    one); prints what goes and the bytes freed."""
    from contemplation.index import retention

    done = retention.prune(ctx_home(ctx), retention.parse_age(older_than), dry_run=dry_run)
    if not dry_run:
        from contemplation.faces.cli import slotfiles

        slotfiles.drop_gone(ctx)  # their slot files, with no daemon running
    verb = "would remove" if dry_run else "removed"
    lines = [
        f"{verb} {r['id']}  (last activity {r['last_activity']}, {show.size(r['bytes'])})"
        for r in done.removed
    ]
    total = f"{verb} {len(done.removed)} archived conversation(s), {show.size(done.freed)}"
    emit(done.as_dict(), as_json, safe("\n".join([*lines, total])))
