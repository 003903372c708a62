"""The read commands a person types most: ``list``, ``status`` and ``tail``. They start like
native tools: each loads only what it uses (no settings model where its verdict is known,
:mod:`contemplation.faces.cli.light`; no action, backend or asyncio module), and what only one
branch needs is imported in that branch. ``tests/system/test_read_commands_light.py`` names
the modules they must not load. Loaded only when one of them runs (see
:mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from contemplation.base.terminal import safe
from contemplation.faces.cli import show
from contemplation.faces.cli.common import (
    CONVERSATION,
    ctx_home,
    ctx_light,
    ctx_settings,
    emit,
    face,
    json_option,
    lookup,
)
from contemplation.store.layout import Conv, Home, refused_folders

if TYPE_CHECKING:
    from contemplation.faces.reading import Reader


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows.")
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(min=0),
    default=0,
    help="Only the last N lines (with --json: the last N blocks; 0: all).",
)
@json_option(
    "One JSON object per block, one a line (offset, from, to, time, kind, text, needs, ...); "
    "with -f each block is printed once it is complete."
)
@click.pass_context
def tail(ctx: click.Context, conversation: str, follow: bool, lines: int, as_json: bool) -> None:
    """Print a conversation's messages.log."""
    from contemplation.store.cursors import log_text
    from contemplation.store.logview import read_log_bytes

    home = ctx_home(ctx)
    conv = lookup(ctx, conversation)
    if as_json:
        from contemplation.faces.reading import Reader

        _tail_json(Reader(home), conv, lines, follow)
        return
    if follow:  # loaded before the log is read: the folder may move while it loads
        from contemplation.faces.cli import wait as following

        conv = following.current(home, conv)
    live = read_log_bytes(conv)
    text = log_text(conv)  # rotated segments (oldest first) and the live log
    if lines:
        text = "".join(text.splitlines(keepends=True)[-lines:])
    sys.stdout.write(safe(text))
    sys.stdout.flush()
    if not follow:
        return
    follower = following.Follower(home, conv, offset=len(live))
    while follow:
        time.sleep(following.POLL)
        follower.drain()


def _print_blocks(blocks: list[dict[str, Any]]) -> None:
    for b in blocks:  # ASCII JSON: model text cannot reach the terminal as controls
        sys.stdout.write(json.dumps(b) + "\n")
    sys.stdout.flush()


def _tail_json(reader: Reader, conv: Conv, lines: int, follow: bool) -> None:
    got = reader.since(conv, 0)
    blocks = got.blocks[-lines:] if lines else got.blocks
    if got.partial is not None and not follow:
        blocks.append({**got.partial, "in_progress": True})
    _print_blocks(blocks)
    cursor = got.cursor
    if not follow:
        return
    from contemplation.faces.cli import wait as following

    while follow:
        time.sleep(following.POLL)
        conv = following.current(reader.home, conv)
        got = reader.since(conv, cursor)
        _print_blocks(got.blocks)
        cursor = got.cursor


@click.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include completed conversations.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="At most this many (a page)."
)
@click.option("--cursor", help="The next page: the cursor a --limit page ended with.")
@json_option(
    "Print {conversations, count, total, more, cursor (while more follow)} as JSON, the shape "
    "of MCP conversation_list."
)
@click.pass_context
def list_(
    ctx: click.Context, show_all: bool, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    """List conversations, the latest activity first."""
    from contemplation.index import listing

    home = ctx_home(ctx)
    page = listing.page(home, listing.Query(scope="all" if show_all else "active"), limit, cursor)
    rows, nxt = page.rows, page.cursor
    refused = refused_folders(home) if show_all else []
    if as_json:
        emit(page.as_dict(), True, "")
        return
    if not rows and not refused:
        click.echo("no conversations")
        return
    if rows:
        forks = any(r.get("forked_from") for r in rows)  # a column only when a fork is listed
        click.echo(
            show.table(
                [
                    (
                        r["id"],
                        show.list_status(r["status"], r["completed"]),
                        show.list_model(r),
                        r["last_activity"],
                        *((show.fork_origin(r.get("forked_from")) or "-",) if forks else ()),
                    )
                    for r in rows
                ],
                ("ID", "STATUS", "MODEL", "LAST ACTIVITY", *(("FORKED FROM",) if forks else ())),
            )
        )
    for where, why in refused:  # folders made by hand that are not taken, and why
        click.echo(safe(f"not taken: {where}: {why}"), err=True)
    if nxt is not None:
        more = " --all" if show_all else ""
        click.echo(f"more: contemplation list{more} --limit {limit} --cursor {nxt}", err=True)


@click.command()
@click.argument("conversation", required=False, type=CONVERSATION)
@json_option("Print the status as a JSON object.")
@click.pass_context
def status(ctx: click.Context, conversation: str | None, as_json: bool) -> None:
    """A conversation's status; without one, the daemon's."""
    home = ctx_home(ctx)
    if conversation is None:
        data = _daemon_status(home, ctx_light(ctx).embed)
        _emit_lines(data, as_json)
        return
    _conversation_status(ctx, home, lookup(ctx, conversation), as_json)


def _conversation_status(ctx: click.Context, home: Home, conv: Conv, as_json: bool) -> None:
    from contemplation.faces import decisions
    from contemplation.faces.reading import Reader
    from contemplation.store import openfiles, plain, room, waiting
    from contemplation.values import BUSY, Status
    from contemplation.writer import daemon_alive

    reader = Reader(home)
    data = reader.summary(conv)
    state = plain.state(conv)  # as the model dumps it: no pydantic for a status
    full = room.full(home.root) if state is not None and state["status"] in BUSY else ""
    if state is not None and full:  # state.json cannot be written now: the turn is not
        state = {**state, "status": Status.RETRYING, "generating_since": None}
        data.update(status=Status.RETRYING.value, disk_full=full)  # generating
    if state:
        data.update(_state_details(state))
    view = reader.standing(conv)
    items = view.items
    words = face()
    data["waiting"] = [i.as_dict(conv.id, words) for i in items]
    data["activity"] = reader.activity(conv, view)  # the words of MCP and the dashboard
    data["daemon_running"] = daemon_alive(home)
    if {data["backend"], data["model"]} & ctx_light(ctx).aliases:  # what the alias stands for
        from contemplation.backends import providers

        target = providers.target(ctx_settings(ctx), data["backend"], data["model"])
        if target.alias is not None:
            where = list(target.providers)
            data["alias"] = {"name": target.alias, "model": target.model, "providers": where}
    meta = view.meta_doc
    if meta is not None and meta.get("panel"):  # each seat: its label, backend and model
        synth = meta.get("synthesize")  # (Metadata.seats: the synthesizing one last)
        data["panel"] = [*meta["panel"], *([synth] if synth else [])]
    try:
        mtime: float | None = conv.log.stat().st_mtime
    except FileNotFoundError:
        mtime = None
    human = show.conversation(data, state, mtime)
    told = [f"now:          {data['activity']}", *waiting.lines(conv.id, items, words)]
    if state is not None and state["reply_cut"] is not None:  # the last reply is not whole
        told.append(f"cut:          {state['reply_cut']['message']}")
    data["being_written"] = [] if conv.is_completed else openfiles.being_written_in(conv)
    told += [  # left in the inbox until its writer closes it (docs/reference/format.md)
        f"writing:      inbox/{name} is still being written (open for writing); taken once closed"
        for name in data["being_written"]
    ]
    data["decisions"], said = decisions.for_status(home, conv)  # who decided what, when
    told += said
    _emit_lines(data, as_json, "\n".join([human, *told]))


def _emit_lines(data: dict[str, Any], as_json: bool, human: str | None = None) -> None:
    if human is None:
        human = "\n".join(f"{k}: {_word(v)}" for k, v in data.items())
    emit(data, as_json, human)


def _word(value: Any) -> str:
    """A value as a person reads it: yes/no, not Python's True/False."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _state_details(state: dict[str, Any]) -> dict[str, Any]:
    """What ``status CONV --json`` says of state.json, from the model's dump
    (:func:`contemplation.store.plain.state`)."""
    from contemplation.protocol import ledger
    from contemplation.values import Status

    generating = state["status"] == Status.GENERATING
    return {
        "last_turn": state["last_turn"],
        "reply_cut": state["reply_cut"],
        "ledger": ledger.total_of(state["ledger"]),
        "generating_since": state["generating_since"] if generating else None,
        "retry_count": state["retry_count"],
        "next_retry_at": state["next_retry_at"],
        "pending_approvals": state["pending_approvals"],
        "parse_errors": state["parse_errors"],
        "warnings": state["warnings"],
    }


def _daemon_status(home: Home, embed: tuple[str, str, str, float]) -> dict[str, Any]:
    from contemplation.index import ledger as ledger_sums
    from contemplation.index import listing, pending
    from contemplation.store import room
    from contemplation.writer.files import daemon_alive

    counts = listing.counts(home)
    data: dict[str, Any] = {
        "home": str(home.root),
        "daemon_running": daemon_alive(home),
        "active": counts["active"],
        "completed": counts["completed"],
        "disk_active": show.size(counts["active_bytes"]),
        "disk_completed": show.size(counts["completed_bytes"]),
    }
    if (unembedded := pending.waiting(home, *embed[:3])) is not None:  # the semantic extra
        data["not_embedded"] = unembedded  # for the current model: search by meaning misses them
    total = ledger_sums.summed(home, limit=1)["total"]  # every conversation, from the index
    if total["turns"]:
        from contemplation.protocol import ledger

        data["ledger"] = ledger.sums_line(total)
    now = time.time()
    generating = [
        f"{r['id']} since {time.strftime('%H:%M:%S', time.localtime(since))} ({now - since:.0f} s)"
        for r in listing.page(home, listing.Query(status="generating")).rows
        if (since := r.get("generating_since")) is not None
    ]
    if generating:
        data["generating"] = generating  # the conversations holding backend slots
    if full := room.full(home.root):  # their turns are retried, not generating
        data["disk_full"] = f"{full}: turns are retried once there is room"
    if data["daemon_running"]:
        from contemplation.faces.dashboard import dashboard_link, token_path

        link = dashboard_link(home)
        if link:
            data["dashboard"] = link
            data["dashboard_token_file"] = str(token_path(home))
    return data
