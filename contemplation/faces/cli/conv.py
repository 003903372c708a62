"""The conversation commands: new, send, wait, respond, approve, cancel, archive, reopen (the
read commands list, status and tail are :mod:`contemplation.faces.cli.reads`). Changes go
through :mod:`contemplation.faces.actions` and reads through :mod:`contemplation.faces.reading`;
the human wording is in :mod:`contemplation.faces.cli.show`. Loaded only when one of them runs
(see :mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from contemplation.backends.catalog import refusal
from contemplation.base import acting
from contemplation.base.terminal import safe
from contemplation.errors import InputRejected
from contemplation.faces import actions, watching
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
from contemplation.faces.reading import Reader
from contemplation.protocol import structured
from contemplation.settings import Settings
from contemplation.store import attachments, waiting
from contemplation.store.layout import (
    Conv,
    Home,
    read_state,
)
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
        from contemplation.faces.cli import slotfiles

        slotfiles.drop_gone(ctx)  # with no daemon running (a running one does it)
    click.echo(str(conv.dir))


@click.command()
@click.argument("conversation", type=CONVERSATION)
@click.pass_context
def reopen(ctx: click.Context, conversation: str) -> None:
    """Bring an archived conversation back to active/ to continue it; prints where it is."""
    conv = actions.reopen(ctx_home(ctx), lookup(ctx, conversation))
    click.echo(str(conv.dir))
