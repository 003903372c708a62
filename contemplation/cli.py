"""The command line: thin over the library. Changes go through :mod:`contemplation.actions`
and reads through :mod:`contemplation.reading`, as in the MCP server and the dashboard; the
human wording is in :mod:`contemplation.show`. Errors are one line on stderr and a non-zero
exit (the codes are in :data:`contemplation.cli_common.EXIT_CODES`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from click.shell_completion import get_completion_class

from contemplation import __version__, actions, activity, backends, cli_wait, show, waiting
from contemplation.cli_common import (
    CONVERSATION,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    TEMPLATE,
    ctx_home,
    ctx_settings,
    emit,
    fail,
    json_option,
    lookup,
    text_arg,
)
from contemplation.cli_models import in_use, models
from contemplation.cli_routes import routes
from contemplation.cli_service import service_group
from contemplation.cli_store import memory, state, templates
from contemplation.errors import ConfigError, ContemplationError
from contemplation.layout import (
    Conv,
    Home,
    inbox_entries,
    list_conversations,
    processing_entries,
    read_log_bytes,
    read_metadata,
    read_state,
)
from contemplation.models import State, Status
from contemplation.reading import Reader, log_text, summary
from contemplation.terminal import safe
from contemplation.writer import daemon_alive, ensure_home

POLL = 0.1  # seconds between looks at the folder while following or waiting
PROG = "contemplation"


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ContemplationError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, epilog=EXIT_CODES)
@click.version_option(__version__, prog_name=PROG)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    help="Conversation home (default: CONTEMPLATION_HOME or the platform data dir).",
)
@click.option("--config", type=click.Path(path_type=Path), help="TOML settings file.")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "json"]),
    help="Diagnostic log format (stderr).",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (stderr).")
@click.pass_context
def main(
    ctx: click.Context,
    home: Path | None,
    config: Path | None,
    log_format: str | None,
    verbose: bool,
) -> None:
    """contemplation: a folder that is an asynchronous conversation queue with local LLMs."""
    overrides: dict[str, Any] = {}
    if log_format:
        overrides["log_format"] = log_format
    if verbose:
        overrides["log_level"] = "debug"
    ctx.ensure_object(dict).update(home=home, config=config, overrides=overrides)


# --------------------------------------------------------------------------- conversations


WAIT = click.option(
    "--wait", is_flag=True, help="Stream the exchange to stdout and return when it is done."
)
TIMEOUT = click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0,
    help="With --wait: give up after this many seconds (0: never); exit code 4.",
)


def _follow(reader: Reader, conv: Conv, ex: cli_wait.Exchange, timeout: float) -> None:
    cli_wait.note_no_daemon(reader.home)
    sys.exit(cli_wait.follow(reader, conv, ex, timeout))


@main.command()
@click.argument("topic")
@click.option("--model", "-m", help="Model name (default: template, then config).")
@click.option("--backend", "-b", help=f"Backend ({', '.join(backends.available())}).")
@click.option("--template", "-t", type=TEMPLATE, help="Template name (default: default).")
@click.option(
    "--think/--no-think",
    default=None,
    help="Ask the model to think before it answers, or not (default: the template's choice).",
)
@click.option("--message", "message", help="First message (TEXT, or - for stdin).")
@WAIT
@TIMEOUT
@json_option('Print {"id", "path", "queued"} as JSON.')
@click.pass_context
def new(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    topic: str,
    model: str | None,
    backend: str | None,
    template: str | None,
    think: bool | None,
    message: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Start a conversation; prints its id (with --message … --wait, on stderr, and the
    exchange on stdout)."""
    s = ctx_settings(ctx)
    text = None
    if message is not None:
        text = text_arg(message)
        actions.check_text(text, s)  # before anything is created
    elif wait:
        raise click.UsageError("--wait needs --message: there is nothing to wait for")
    conv = actions.create(s, topic, model=model, backend=backend, template=template, think=think)
    reader = Reader(Home(s.home))
    ex = cli_wait.begin(reader, conv, text)
    queued = actions.send(s, conv, text) if text is not None else None
    data = {"id": conv.id, "path": str(conv.dir), "queued": queued}
    if not wait or text is None:
        emit(data, as_json, conv.id)
        return
    click.echo(conv.id, err=True)
    _follow(reader, conv, ex, timeout)


@main.command(epilog=EXIT_CODES)
@click.argument("conversation", type=CONVERSATION)
@click.argument("text")
@WAIT
@TIMEOUT
@click.pass_context
def send(ctx: click.Context, conversation: str, text: str, wait: bool, timeout: float) -> None:
    """Send TEXT (or - for stdin) to a conversation's inbox.

    With --wait, the exchange this message starts streams to stdout. When the model stops
    for the agent, each need and lookup waiting, with the command that settles it, go to
    stderr and the exit code is 3."""
    s = ctx_settings(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(Home(s.home))
    body = text_arg(text)
    ex = cli_wait.begin(reader, conv, body)
    name = actions.send(s, conv, body)
    if not wait:
        click.echo(f"queued for {conv.id} (inbox/{name})")
        return
    _follow(reader, conv, ex, timeout)


@main.command(epilog=EXIT_CODES)
@click.argument("conversation", type=CONVERSATION)
@TIMEOUT
@click.pass_context
def wait(ctx: click.Context, conversation: str, timeout: float) -> None:
    """Print the current exchange (from the agent's last own message) and follow it until the
    model is done; exit codes as `send --wait`."""
    home = ctx_home(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(home)
    _follow(reader, conv, cli_wait.Exchange(reader.last_own(conv)), timeout)


@main.command()
@click.argument("conversation", type=CONVERSATION)
@click.argument("text")
@click.option("--need", help="Which need this answers: its id (or a unique prefix) or its text.")
@WAIT
@TIMEOUT
@json_option('Print {"answered", "need_id", "queued", "still_waiting", "cursor"} as JSON.')
@click.pass_context
def respond(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    conversation: str,
    text: str,
    need: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Answer a need the model is waiting for (TEXT, or - for stdin).

    --need may be left out when one need waits; when the model waits for none, TEXT is
    queued as a plain message. A lookup waiting for approval is decided with `approve`."""
    s = ctx_settings(ctx)
    conv = lookup(ctx, conversation)
    reader = Reader(Home(s.home))
    body = text_arg(text)
    ex = cli_wait.begin(reader, conv, body)
    done = actions.respond(s, reader, conv, body, need)
    if not wait:
        emit(done, as_json, show.responded(done))
        return
    click.echo(show.responded(done), err=True)
    _follow(reader, conv, ex, timeout)


@main.command()
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
    done = actions.approve(s, conv, decision, need, reader=reader)
    verb = {"once": "approved once", "always": "approved always", "reject": "rejected"}[decision]
    args = json.dumps(done["arguments"], ensure_ascii=False)
    lines = [f"{verb}: {done['tool']} {args} (for: {done['need']})"]
    lines.extend(waiting.still(done["still_waiting"]))
    if not wait:
        emit(done, as_json, safe("\n".join(lines)))
        return
    click.echo(safe("\n".join(lines)), err=True)
    _follow(reader, conv, cli_wait.Exchange(after, request=done["request"]), timeout)


@main.command()
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
    follower = cli_wait.Follower(home, conv, offset=len(live))
    while follow:
        time.sleep(POLL)
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
        time.sleep(POLL)
        conv = cli_wait.current(reader.home, conv)
        got = reader.since(conv, cursor)
        _print_blocks(got.blocks)
        cursor = got.cursor


@main.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include completed conversations.")
@json_option("Print the conversations' summaries as a JSON array.")
@click.pass_context
def list_(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """List conversations, the latest activity first."""
    rows = Reader(ctx_home(ctx)).summaries(include_completed=show_all)
    if as_json:
        emit(rows, True, "")
        return
    if not rows:
        click.echo("no conversations")
        return
    click.echo(
        show.table(
            [
                (
                    r["id"],
                    r["status"] + (" (archived)" if r["completed"] else ""),
                    f"{r['backend']}/{r['model']}",
                    r["last_activity"],
                )
                for r in rows
            ],
            ("ID", "STATUS", "MODEL", "LAST ACTIVITY"),
        )
    )


@main.command()
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
    data = summary(conv)
    state = read_state(conv)
    if state:
        data.update(_state_details(state))
    items = reader.waiting(conv)
    data["waiting"] = [i.as_dict(conv.id, "cli") for i in items]
    data["activity"] = _activity(reader, conv, state, items)
    data["daemon_running"] = daemon_alive(home)
    st = cli_wait.stat_or_none(conv.log)
    human = show.conversation(data, state, st.st_mtime if st else None)
    told = [f"now:          {data['activity']}", *waiting.lines(conv.id, items)]
    _emit_lines(data, as_json, "\n".join([human, *told]))


def _activity(reader: Reader, conv: Conv, state: State | None, items: list[Any]) -> str:
    meta = read_metadata(conv)
    queued = 0 if conv.is_completed else len(inbox_entries(conv)) + len(processing_entries(conv))
    model = meta.model if meta else ""
    behind = 0
    if queued and meta is not None:
        rows = reader.summaries(include_completed=False)
        behind = activity.queued_behind(conv.id, meta.backend, model, rows)
    asks = sum(1 for i in items if i.kind == "approval")
    return activity.describe(
        state,
        model=model,
        daemon=daemon_alive(reader.home),
        queued=queued,
        behind=behind,
        waiting=(len(items) - asks, asks),
    )


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
        "generating_since": state.generating_since if state.status is Status.GENERATING else None,
        "retry_count": state.retry_count,
        "next_retry_at": state.next_retry_at,
        "pending_approvals": [r.model_dump(mode="json") for r in state.pending_approvals],
        "parse_errors": state.parse_errors,
        "warnings": state.warnings,
    }


def _daemon_status(home: Home) -> dict[str, Any]:
    convs = list_conversations(home, include_completed=True)
    data: dict[str, Any] = {
        "home": str(home.root),
        "daemon_running": daemon_alive(home),
        "active": sum(1 for c in convs if not c.is_completed),
        "completed": sum(1 for c in convs if c.is_completed),
    }
    generating = [
        f"{c.id} since {time.strftime('%H:%M:%S', time.localtime(st.generating_since))} "
        f"({time.time() - st.generating_since:.0f} s)"
        for c in convs
        if not c.is_completed
        and (st := read_state(c)) is not None
        and st.status is Status.GENERATING
        and st.generating_since is not None
    ]
    if generating:
        data["generating"] = generating  # the conversations holding backend slots
    from contemplation.dashboard import dashboard_link, token_path

    link = dashboard_link(home) if data["daemon_running"] else None
    if link:
        data["dashboard"] = link
        data["dashboard_token_file"] = str(token_path(home))
    return data


@main.command()
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


@main.command("archive")
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


# --------------------------------------------------------------------------- daemon


@main.command()
@click.option("--once", is_flag=True, help="Process whatever is pending, then exit.")
@click.option(
    "--dashboard-port",
    type=int,
    default=None,
    help="Dashboard port (default 5556; 0: any free one).",
)
@click.option("--no-dashboard", is_flag=True, help="Do not serve the dashboard.")
@click.pass_context
def run(ctx: click.Context, once: bool, dashboard_port: int | None, no_dashboard: bool) -> None:
    """Run the daemon in the foreground.

    Ctrl-C lets the turns in flight finish (stop_grace seconds, said on stderr); a second
    Ctrl-C stops at once (the cut reply is marked and redone on the next start)."""
    from contemplation import daemon

    overrides = ctx.ensure_object(dict).setdefault("overrides", {})
    if dashboard_port is not None:
        overrides["dashboard_port"] = dashboard_port
    if no_dashboard:
        overrides["dashboard_enabled"] = False
    s = ctx_settings(ctx)
    extras: list[daemon.Extra] = []
    if s.dashboard_enabled:
        from contemplation.dashboard import serve_dashboard

        extras.append(serve_dashboard)
    if s.notifications:
        from contemplation.notify import run_notifications

        extras.append(run_notifications)
    code = asyncio.run(daemon.run_once(s) if once else daemon.serve(s, extras=extras))
    sys.exit(code)


@main.command()
@click.option(
    "--http",
    "http_port",
    type=int,
    default=None,
    help="Serve streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio.",
)
@click.pass_context
def mcp(ctx: click.Context, http_port: int | None) -> None:
    """MCP server for agents (stdio by default)."""
    from contemplation import mcp_server

    mcp_server.run(ctx_settings(ctx), http_port=http_port)


@main.command()
@json_option('Print {"ok", "checks": [{"check", "ok", "detail"}]} as JSON.')
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the home, the config and every configured backend."""
    s = ctx_settings(ctx)
    home = Home(s.home)
    results: list[dict[str, Any]] = []

    def add(name: str, ok: bool, detail: str, *, warn: bool = False) -> None:
        row: dict[str, Any] = {"check": name, "ok": ok, "detail": detail}
        results.append(row | {"warn": True} if warn else row)

    from contemplation.validate import validate

    try:
        validate(s)  # the very check `run` makes at start
        add("config", True, str(s.config_file) if s.config_file else "defaults (no config file)")
    except ConfigError as exc:
        add("config", False, str(exc))
    try:
        ensure_home(home)
        probe = home.root / f".doctor.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
        add("home", True, f"{home.root} is writable")
    except OSError as exc:
        add("home", False, f"{home.root}: {exc}")
    add(
        "daemon",
        True,
        "running" if daemon_alive(home) else "not running (start: contemplation run)",
    )

    used = in_use(home)

    async def probe_backends() -> None:
        for c in await backends.check_all(s, extra=sorted(used)):
            detail = c.detail + "".join(f"\n    hint: {h}" for h in c.hints)
            if c.ok or c.name in used or c.name not in backends.available():
                add(c.name, c.ok, detail)  # (a model or other check: its failure stands)
            else:  # a backend nothing uses now is unreachable: worth saying, not a failure
                add(c.name, True, f"{detail}\n    (no active conversation uses it)", warn=True)

    asyncio.run(probe_backends())
    ok = all(r["ok"] for r in results)
    if as_json:
        emit({"ok": ok, "checks": results}, True, "")
    else:
        for r in results:
            word = "warn" if r.get("warn") else "ok " if r["ok"] else "FAIL"
            click.echo(f"{word} {r['check']:<8} {r['detail']}")
    sys.exit(EXIT_OK if ok else EXIT_ERROR)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL: commands, options, conversation ids (active
    and completed) and template names.

    \b
    bash:  eval "$(contemplation completion bash)"      (in ~/.bashrc)
    zsh:   eval "$(contemplation completion zsh)"       (in ~/.zshrc)
    fish:  contemplation completion fish > ~/.config/fish/completions/contemplation.fish
    """
    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - click knows the three
        fail(f"no completion for {shell}")
    click.echo(cls(main, {}, PROG, f"_{PROG.upper()}_COMPLETE").source())


main.add_command(service_group)
main.add_command(routes)
main.add_command(models)
main.add_command(memory)
main.add_command(state)
main.add_command(templates)

if __name__ == "__main__":  # pragma: no cover
    main()
