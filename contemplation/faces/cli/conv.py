"""The conversation commands: new, send, wait, respond, approve, tail, list, status,
cancel, archive. Changes go through :mod:`contemplation.faces.actions` and reads through
:mod:`contemplation.faces.reading`; the human wording is in :mod:`contemplation.faces.cli.show`.
Loaded only
when one of them runs (see :mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from contemplation.backends import providers
from contemplation.backends.catalog import refusal
from contemplation.base import acting
from contemplation.base.terminal import safe
from contemplation.errors import InputRejected
from contemplation.faces import actions, decisions, watching
from contemplation.faces.cli import show
from contemplation.faces.cli import wait as following
from contemplation.faces.cli.common import (
    CONVERSATION,
    EXIT_CODES,
    EXIT_ERROR,
    TEMPLATE,
    ctx_home,
    ctx_settings,
    emit,
    face,
    fail,
    json_option,
    lookup,
    text_arg,
)
from contemplation.faces.reading import Reader, log_text
from contemplation.models import BUSY, LedgerSums, State, Status
from contemplation.protocol import ledger, structured
from contemplation.settings import Settings
from contemplation.store import attachments, openfiles, room, waiting
from contemplation.store.layout import (
    Conv,
    Home,
    read_state,
    refused_folders,
)
from contemplation.store.logview import read_log_bytes
from contemplation.writer import daemon_alive

# --------------------------------------------------------------------------- conversations


WAIT = click.option(
    "--wait", is_flag=True, help="Stream the exchange to stdout and return when it is done."
)
ATTACH = click.option(
    "--attach",
    "attach",
    multiple=True,
    type=click.Path(dir_okay=True, path_type=Path),
    help="A file the message carries (repeatable): an image, or a text file inlined.",
)
TIMEOUT = click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0,
    help="With --wait: give up after this many seconds (0: never); exit code 4.",
)


def _follow(
    reader: Reader, conv: Conv, ex: following.Exchange, timeout: float, *, as_json: bool = False
) -> None:
    following.note_no_daemon(reader.home)
    sys.exit(following.follow(reader, conv, ex, timeout, as_json=as_json))


@click.command()
@click.argument("topic")
@click.option(
    "--model",
    "-m",
    "models",
    multiple=True,
    help="Model name (default: template, then config); repeat it for a panel of models that "
    "each answer every message.",
)
@click.option(
    "--debate", is_flag=True, help="A panel: each model also sees the others' last answers."
)
@click.option("--synthesize", metavar="MODEL", help="A panel: MODEL adds one reply weighing them.")
@click.option("--backend", "-b", help="Backend: ollama, openai, opencode, local or a plugin's.")
@click.option("--template", "-t", type=TEMPLATE, help="Template name (default: default).")
@click.option(
    "--think/--no-think",
    default=None,
    help="Ask the model to think before it answers, or not (default: the template's choice).",
)
@click.option("--message", "message", help="First message (TEXT, or - for stdin).")
@ATTACH
@WAIT
@TIMEOUT
@json_option('Print {"id", "path", "queued"} as JSON.')
@click.pass_context
def new(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    topic: str,
    models: tuple[str, ...],
    debate: bool,
    synthesize: str | None,
    backend: str | None,
    template: str | None,
    think: bool | None,
    message: str | None,
    attach: tuple[Path, ...],
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Start a conversation; prints its id (with --message … --wait, on stderr, and the
    exchange on stdout). Several --model: a panel, each model answering every message."""
    s = ctx_settings(ctx)
    model = models[0] if len(models) == 1 else None
    ask = actions.PanelAsk(models if len(models) > 1 else (), debate, synthesize)
    text = None
    files = attachments.read_paths(attach, s.attachments)  # before anything is created
    if message is not None or files:
        text = text_arg(message) if message is not None else ""
        if text.strip() or not files:
            actions.check_message(text, s)  # before anything is created
    elif wait:
        raise click.UsageError("--wait needs --message: there is nothing to wait for")
    for name in (*models, *([synthesize] if synthesize else [])):
        if why := asyncio.run(refusal(s, backend or s.default_backend, name)):
            raise InputRejected(why)  # an embedding or decision model
    by = watching.started_by(os.environ)  # Claude Code's Bash tool: the agent's
    conv = actions.create(
        s, topic, model=model, backend=backend, template=template, think=think, started_by=by,
        ask=ask,
    )  # fmt: skip
    reader = Reader(Home(s.home))
    ex = following.begin(reader, conv, _block(text, files, s), wait=wait)
    queued = actions.send(s, conv, text, files) if text is not None else None
    data = {"id": conv.id, "path": str(conv.dir), "queued": queued}
    if not wait or queued is None:
        emit(data, as_json, conv.id)
        return
    ex.queued = queued
    click.echo(conv.id, err=True)
    _follow(reader, conv, ex, timeout)


def _block(text: str | None, files: tuple[attachments.Attachment, ...], s: Settings) -> str | None:
    """The agent block a message becomes (with files: its lines too), for --wait to find."""
    if text is None or not files:
        return text
    return attachments.block_text(text, files, s.attachments)


SCHEMA = click.option(
    "--schema",
    metavar="FILE_OR_JSON",
    help="A JSON Schema the reply must match (JSON text, or a file holding it).",
)
PLAIN = click.option(
    "--plain",
    is_flag=True,
    help="Send it even though needs or lookups wait (they stay unanswered); without it, send "
    "refuses then and lists them, as MCP does without plain=true.",
)
WAIT_JSON = json_option(
    'With --wait: print the exchange as one JSON object at the end ({"blocks", "text", '
    '"parsed" when the reply matched its schema, "status", "exit_code"}).'
)


@click.command(epilog=EXIT_CODES)
@click.argument("conversation", type=CONVERSATION)
@click.argument("text")
@ATTACH
@SCHEMA
@PLAIN
@WAIT
@TIMEOUT
@WAIT_JSON
@click.pass_context
def send(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str,
    text: str,
    attach: tuple[Path, ...],
    schema: str | None,
    plain: bool,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Send TEXT (or - for stdin) to a conversation's inbox, with the files --attach names.

    While the model waits for needs or lookups, send refuses (exit 1) and lists them with
    the commands that settle them; --plain sends anyway and says what stays unanswered.
    With --wait, the exchange this message starts streams to stdout. When the model stops
    for the agent, each need and lookup waiting, with the command that settles it, go to
    stderr and the exit code is 3. With --schema the reply must be JSON that matches it."""
    s = ctx_settings(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(Home(s.home))
    body = text_arg(text)
    files = attachments.read_paths(attach, s.attachments)
    if schema is not None:
        body = structured.with_schema(body, structured.load_schema(schema, s.max_schema_bytes))
    left = _unanswered(reader, conv, plain=plain)
    ex = following.begin(reader, conv, _block(body, files, s), wait=wait)
    name = actions.send(s, conv, body, files)
    ex.queued = name
    if left:
        click.echo(safe(f"note: left unanswered: {waiting.listed(left)}"), err=True)
    if not wait:
        if as_json:
            click.echo(json.dumps({"conversation_id": conv.id, "queued": name}))
        else:
            click.echo(f"queued for {conv.id} (inbox/{name})")
        return
    _follow(reader, conv, ex, timeout, as_json=as_json)


def _unanswered(reader: Reader, conv: Conv, *, plain: bool) -> list[Any]:
    """What the model waits for, which a message now leaves unanswered (it moves the
    conversation past it): nothing is left in silence, so without ``plain`` it is refused
    with each item and its command, as MCP's respond is without plain=true; with it, the
    items, for the caller to say once the message is queued."""
    items = reader.waiting(conv)
    if not items or plain:
        return items
    asks = sum(1 for i in items if i.kind == "approval")
    parts = [f"{len(items) - asks} answer(s)"] if len(items) > asks else []
    parts += [f"the approval of {asks} lookup(s)"] if asks else []
    them = "them" if len(items) > 1 else "it"
    click.echo(
        safe(
            f"error: {conv.id} waits for {' and '.join(parts)} from you; a message now leaves "
            f"{them} unanswered. Settle {them}, or send the message anyway with --plain:"
        ),
        err=True,
    )
    click.echo("\n".join(waiting.lines(conv.id, items, face())), err=True)
    sys.exit(EXIT_ERROR)


@click.command(epilog=EXIT_CODES)
@click.argument("conversation", type=CONVERSATION)
@TIMEOUT
@WAIT_JSON
@click.pass_context
def wait(ctx: click.Context, conversation: str, timeout: float, as_json: bool) -> None:
    """Print the current exchange (from the agent's last own message) and follow it until the
    model is done; exit codes as `send --wait`."""
    home = ctx_home(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(home)
    ex = following.Exchange(reader.last_own(conv), latest=True)
    _follow(reader, conv, ex, timeout, as_json=as_json)


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.argument("text")
@click.option("--need", help="Which need this answers: its id (or a unique prefix) or its text.")
@click.option("--plain", is_flag=True, help="Send TEXT as a new message, whatever waits (= send).")
@WAIT
@TIMEOUT
@json_option('Print {"answered", "need_id", "queued", "still_waiting", "cursor"} as JSON.')
@click.pass_context
def respond(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str,
    text: str,
    need: str | None,
    plain: bool,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Answer a need the model is waiting for (TEXT, or - for stdin).

    --need may be left out when one need waits; when the model waits for none, TEXT is
    queued as a plain message, unless a need was answered since the agent's last message
    (another agent came first, even if the model replied since): then nothing is sent, the
    exit status is 1 and the line says who answered it and when (a new message is `send`, or
    --plain). A lookup waiting for approval is the person's (`approve` in their terminal)."""
    s = ctx_settings(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(Home(s.home))
    body = text_arg(text)
    ex = following.begin(reader, conv, body, wait=wait)
    done = actions.respond(s, reader, conv, body, need, plain=plain, face=face())
    ex.queued = done["queued"]
    if not wait:
        emit(done, as_json, show.responded(done))
        return
    click.echo(show.responded(done), err=True)
    _follow(reader, conv, ex, timeout)


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.option(
    "--need", help="Which lookup: its id (or a unique prefix) or its need; when several wait."
)
@click.option("--once", "decision", flag_value="once", help="Let it through this time.")
@click.option(
    "--always",
    "decision",
    flag_value="always",
    help="Let it through, and the same tool with the same arguments in this conversation.",
)
@click.option("--reject", "decision", flag_value="reject", help="Refuse it; the model is told.")
@WAIT
@TIMEOUT
@json_option('Print {"decision", "need", "tool", "arguments", "request", "still_waiting"}.')
@click.pass_context
def approve(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str,
    need: str | None,
    decision: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Decide about a lookup that waits for approval (status awaiting_approval)."""
    if decision is None:
        raise click.UsageError("say --once, --always or --reject")
    s = ctx_settings(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(Home(s.home))
    after = reader.boundary(conv)
    who = acting.here()
    if who.is_agent:  # the agent's shell: the agent's decision, under agent_approves
        actions.agent_may_approve(s, conv, forms=who.forms)
        done = actions.approve(
            s, conv, decision, need, reader=reader, face="agent-cli", agent=who.agent
        )
    else:
        done = actions.approve(s, conv, decision, need, reader=reader)
    verb = {"once": "approved once", "always": "approved always", "reject": "rejected"}[decision]
    args = json.dumps(done["arguments"], ensure_ascii=False)
    lines = [f"{verb}: {done['tool']} {args} (for: {done['need']})"]
    lines.extend(waiting.still(done["still_waiting"]))
    if not wait:
        emit(done, as_json, safe("\n".join(lines)))
        return
    click.echo(safe("\n".join(lines)), err=True)
    _follow(reader, conv, following.Exchange(after, request=done["request"]), timeout)


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
    home = ctx_home(ctx)
    conv = lookup(ctx, conversation)
    if as_json:
        _tail_json(Reader(home), conv, lines, follow)
        return
    live = read_log_bytes(conv)
    text = log_text(conv)  # rotated segments (oldest first) and the live log
    if lines:
        text = "".join(text.splitlines(keepends=True)[-lines:])
    sys.stdout.write(safe(text))
    sys.stdout.flush()
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
        data = _daemon_status(home)
        _emit_lines(data, as_json)
        return
    conv = lookup(ctx, conversation)
    reader = Reader(home)
    data = reader.summary(conv)
    state = read_state(conv)
    full = room.full(home.root) if state is not None and state.status in BUSY else ""
    if state is not None and full:  # state.json cannot be written now: the turn is not
        state = state.model_copy(update={"status": Status.RETRYING, "generating_since": None})
        data.update(status=Status.RETRYING.value, disk_full=full)  # generating
    if state:
        data.update(_state_details(state))
    view = reader.standing(conv)
    items = view.items
    words = face()
    data["waiting"] = [i.as_dict(conv.id, words) for i in items]
    data["activity"] = reader.activity(conv, view)  # the words of MCP and the dashboard
    data["daemon_running"] = daemon_alive(home)
    target = providers.target(ctx_settings(ctx), data["backend"], data["model"])
    if target.alias is not None:  # what the alias stands for
        where = list(target.providers)
        data["alias"] = {"name": target.alias, "model": target.model, "providers": where}
    if view.meta is not None and view.meta.panel:  # each seat: its label, backend and model
        data["panel"] = [s.model_dump(mode="json") for s in view.meta.seats()]
    st = following.stat_or_none(conv.log)
    human = show.conversation(data, state, st.st_mtime if st else None)
    told = [f"now:          {data['activity']}", *waiting.lines(conv.id, items, words)]
    if state is not None and state.reply_cut is not None:  # the last reply is not whole
        told.append(f"cut:          {state.reply_cut.message}")
    data["being_written"] = [] if conv.is_completed else openfiles.being_written_in(conv)
    # left in the inbox until its writer closes it (docs/reference/format.md, the inbox rule)
    told += [
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


def _state_details(state: State) -> dict[str, Any]:
    return {
        "last_turn": state.last_turn.model_dump() if state.last_turn else None,
        "reply_cut": state.reply_cut.model_dump() if state.reply_cut else None,
        "ledger": ledger.total(state.ledger).model_dump(),
        "generating_since": state.generating_since if state.status is Status.GENERATING else None,
        "retry_count": state.retry_count,
        "next_retry_at": state.next_retry_at,
        "pending_approvals": [r.model_dump(mode="json") for r in state.pending_approvals],
        "parse_errors": state.parse_errors,
        "warnings": state.warnings,
    }


def _daemon_status(home: Home) -> dict[str, Any]:
    from contemplation.index import listing

    counts = listing.counts(home)
    data: dict[str, Any] = {
        "home": str(home.root),
        "daemon_running": daemon_alive(home),
        "active": counts["active"],
        "completed": counts["completed"],
        "disk_active": show.size(counts["active_bytes"]),
        "disk_completed": show.size(counts["completed_bytes"]),
    }
    from contemplation.index import ledger as ledger_sums

    total = ledger_sums.summed(home, limit=1)["total"]  # every conversation, from the index
    if total["turns"]:
        data["ledger"] = ledger.line(LedgerSums.model_validate(total))
    now = time.time()
    generating = [
        f"{r['id']} since {time.strftime('%H:%M:%S', time.localtime(since))} ({now - since:.0f} s)"
        for r in listing.page(home, listing.Query(status=Status.GENERATING.value)).rows
        if (since := r.get("generating_since")) is not None
    ]
    if generating:
        data["generating"] = generating  # the conversations holding backend slots
    if full := room.full(home.root):  # their turns are retried, not generating
        data["disk_full"] = f"{full}: turns are retried once there is room"
    from contemplation.faces.dashboard import dashboard_link, token_path

    link = dashboard_link(home) if data["daemon_running"] else None
    if link:
        data["dashboard"] = link
        data["dashboard_token_file"] = str(token_path(home))
    return data


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.pass_context
def cancel(ctx: click.Context, conversation: str) -> None:
    """Stop the in-flight generation and mark the turn cancelled."""
    home = ctx_home(ctx)
    conv = lookup(ctx, conversation)
    state = read_state(conv)
    if actions.cancel(conv) is None:  # refused, as approve with nothing waiting is
        now = state.status.value if state else "pending"
        fail(f"nothing to cancel: {conv.id} is {now} (no turn is running or retrying)")
    if not daemon_alive(home):
        click.echo(
            "note: no daemon is running; the turn will be marked cancelled when one starts",
            err=True,
        )
    click.echo(f"cancel requested for {conv.id}")


@click.command("archive")
@click.argument("conversation", type=CONVERSATION)
@click.pass_context
def archive_(ctx: click.Context, conversation: str) -> None:
    """Move a conversation to completed/; prints where it is now."""
    conv = lookup(ctx, conversation)
    if conv.is_completed:
        click.echo(f"note: {conv.id} is already archived (in completed/)", err=True)
    else:
        conv = actions.archive_conversation(ctx_home(ctx), conv)
    click.echo(str(conv.dir))


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.pass_context
def reopen(ctx: click.Context, conversation: str) -> None:
    """Bring an archived conversation back to active/ to continue it; prints where it is."""
    conv = actions.reopen(ctx_home(ctx), lookup(ctx, conversation))
    click.echo(str(conv.dir))
