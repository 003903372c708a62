"""The command line: thin over the library. Errors are one line and a non-zero exit."""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from contemplation import __version__, actions, backends, show
from contemplation import settings as settings_mod
from contemplation.actions import archive_conversation
from contemplation.cli_routes import routes
from contemplation.cli_service import service_group
from contemplation.conversation import next_action
from contemplation.errors import ConfigError, ContemplationError
from contemplation.layout import (
    Conv,
    Home,
    find_conversation,
    list_conversations,
    load_template,
    read_log_bytes,
    read_metadata,
    read_state,
)
from contemplation.logs import configure
from contemplation.models import Status
from contemplation.parser import parse
from contemplation.reading import Reader, log_text
from contemplation.settings import Settings
from contemplation.terminal import safe
from contemplation.writer import (
    daemon_alive,
    drop_message,
    ensure_home,
    new_conversation,
)

WAIT_DONE = {Status.IDLE, Status.AWAITING_AGENT, Status.COMPLETE, Status.ERROR, Status.CANCELLED}


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ContemplationError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except KeyboardInterrupt:
            sys.exit(130)


def _settings(ctx: click.Context) -> Settings:
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "settings" not in obj:
        s = settings_mod.load(
            config=obj.get("config"), home=obj.get("home"), overrides=obj.get("overrides") or {}
        )
        configure(s.log_format, s.log_level)
        obj["settings"] = s
    settings: Settings = obj["settings"]
    return settings


def _home(ctx: click.Context) -> Home:
    return Home(_settings(ctx).home)


def _text_arg(text: str) -> str:
    if text == "-":
        return sys.stdin.read()
    return text


def _emit(data: Any, as_json: bool, human: str) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    else:
        click.echo(safe(human))  # model text never drives the terminal


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="contemplation")
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
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
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


@main.command()
@click.argument("topic")
@click.option("--model", "-m", help="Model name (default: template, then config).")
@click.option("--backend", "-b", help=f"Backend ({', '.join(backends.available())}).")
@click.option("--template", "-t", default=None, help="Template name (default: default).")
@click.option("--message", "message", help="First message (TEXT, or - for stdin).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def new(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    topic: str,
    model: str | None,
    backend: str | None,
    template: str | None,
    message: str | None,
    as_json: bool,
) -> None:
    """Start a conversation; prints its id."""
    s = _settings(ctx)
    home = Home(s.home)
    ensure_home(home)
    tpl = load_template(home, template or s.default_template)
    backend_name = backend or tpl.backend or s.default_backend
    if backend_name not in backends.available():
        raise ContemplationError(
            f"unknown backend {backend_name!r}; known: {', '.join(backends.available())}"
        )
    conv = new_conversation(
        home,
        topic,
        template=tpl,
        model=model or tpl.model or s.default_model,
        backend=backend_name,
        durable=s.durability == "fsync",
    )
    if message is not None:
        text = _text_arg(message)
        if not text.strip():
            raise ContemplationError("the message is empty")
        drop_message(conv, text)
    _emit({"id": conv.id, "path": str(conv.dir)}, as_json, conv.id)


@main.command()
@click.argument("conversation")
@click.argument("text")
@click.option("--wait", is_flag=True, help="Stream the reply to stdout and return when it is done.")
@click.option(
    "--timeout",
    type=float,
    default=0,
    help="With --wait: give up after this many seconds (0: never).",
)
@click.pass_context
def send(ctx: click.Context, conversation: str, text: str, wait: bool, timeout: float) -> None:
    """Send TEXT (or - for stdin) to a conversation's inbox."""
    home = _home(ctx)
    conv = find_conversation(home, conversation, include_completed=False)
    body = _text_arg(text)
    if not body.strip():
        raise ContemplationError("the message is empty")
    limit = _settings(ctx).max_message_bytes
    if len(body.encode()) > limit:
        raise ContemplationError(
            f"the message is {len(body.encode())} bytes; the limit is {limit} (max_message_bytes)"
        )
    state = read_state(conv)
    before = state.messages_processed if state else 0
    offset = conv.log.stat().st_size if conv.log.exists() else 0
    path = drop_message(conv, body)
    if not wait:
        click.echo(path.name)
        return
    if not daemon_alive(home):
        click.echo(
            "note: no daemon is running on this home; start one with `contemplation run`", err=True
        )
    _follow_reply(home, conv, before, offset, timeout)


def _follow_reply(home: Home, conv: Conv, before: int, offset: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout if timeout else None
    out = sys.stdout
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        current = conv if conv.dir.exists() else Conv(home.completed / conv.id)
        data = read_log_bytes(current)
        if len(data) > offset:
            out.write(safe(decoder.decode(data[offset:])))
            out.flush()
            offset = len(data)
        state = read_state(current)
        if state and state.messages_processed > before and state.intent is None:
            blocks = parse(
                data, agent_label=(read_metadata(current) or _meta_stub()).agent_label
            ).blocks
            if state.status in WAIT_DONE and next_action(blocks).action != "turn":
                if state.status is Status.ERROR and state.last_error:
                    fail(state.last_error.message)
                return
        if deadline is not None and time.monotonic() > deadline:
            fail("timed out waiting for the reply (it is still queued)", code=3)
        time.sleep(0.05)


def _meta_stub() -> Any:
    class _M:
        agent_label = "CLAUDE"

    return _M()


@main.command()
@click.argument("conversation")
@click.argument("text")
@click.option("--need", help="Which pending need this answers (its text or its number, 1-based).")
@click.pass_context
def respond(ctx: click.Context, conversation: str, text: str, need: str | None) -> None:
    """Answer a need the model is waiting for (TEXT, or - for stdin)."""
    s = _settings(ctx)
    home = Home(s.home)
    conv = find_conversation(home, conversation, include_completed=False)
    state = read_state(conv)
    if not (state.pending_needs if state else []):
        raise ContemplationError(f"{conv.id} is not waiting for an answer to a need")
    done = actions.respond(s, Reader(home), conv, _text_arg(text), need)
    rest = done["still_pending"]
    click.echo(f"answered: {done['answered']}" + (f"\nstill pending: {len(rest)}" if rest else ""))


@main.command()
@click.argument("conversation")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows.")
@click.option("-n", "--lines", type=int, default=0, help="Only the last N lines (0: all).")
@click.pass_context
def tail(ctx: click.Context, conversation: str, follow: bool, lines: int) -> None:
    """Print a conversation's messages.log."""
    home = _home(ctx)
    conv = find_conversation(home, conversation)
    data = read_log_bytes(conv)
    text = log_text(conv)  # rotated segments (oldest first) and the live log
    if lines:
        text = "".join(text.splitlines(keepends=True)[-lines:])
    sys.stdout.write(safe(text))
    sys.stdout.flush()
    offset = len(data)
    ino = conv.log.stat().st_ino if conv.log.exists() else 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # chunks split characters
    while follow:
        time.sleep(0.1)
        if not conv.dir.exists():
            conv = Conv(home.completed / conv.id)
        try:
            st = conv.log.stat()
        except FileNotFoundError:
            continue
        if st.st_ino != ino or st.st_size < offset:
            ino, offset = st.st_ino, 0  # rotated or replaced: follow the new file
        if st.st_size > offset:
            with open(conv.log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.write(safe(decoder.decode(chunk)))
            sys.stdout.flush()


def _summary(conv: Conv) -> dict[str, Any]:
    meta = read_metadata(conv)
    state = read_state(conv)
    try:
        activity = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(conv.log.stat().st_mtime))
    except FileNotFoundError:
        activity = ""
    return {
        "id": conv.id,
        "topic": meta.topic if meta else "",
        "status": (state.status.value if state else "pending")
        if not conv.is_completed or not state
        else state.status.value,
        "completed": conv.is_completed,
        "model": meta.model if meta else "",
        "backend": meta.backend if meta else "",
        "last_activity": activity,
        "turns": state.turns if state else 0,
        "messages": state.messages_processed if state else 0,
        "pending_needs": state.pending_needs if state else [],
        "last_error": state.last_error.model_dump() if state and state.last_error else None,
    }


@main.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include completed conversations.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """List conversations."""
    rows = [_summary(c) for c in list_conversations(_home(ctx), include_completed=show_all)]
    if as_json:
        _emit(rows, True, "")
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
@click.argument("conversation", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, conversation: str | None, as_json: bool) -> None:
    """A conversation's status; without one, the daemon's."""
    home = _home(ctx)
    if conversation is None:
        convs = list_conversations(home, include_completed=True)
        data = {
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
        _emit(data, as_json, "\n".join(f"{k}: {v}" for k, v in data.items()))
        return
    conv = find_conversation(home, conversation)
    data = _summary(conv)
    state = read_state(conv)
    if state:
        data["last_turn"] = state.last_turn.model_dump() if state.last_turn else None
        data["generating_since"] = (
            state.generating_since if state.status is Status.GENERATING else None
        )
        data["retry_count"] = state.retry_count
        data["next_retry_at"] = state.next_retry_at
        data["parse_errors"] = state.parse_errors
        data["warnings"] = state.warnings
    try:
        mtime: float | None = conv.log.stat().st_mtime
    except OSError:
        mtime = None
    _emit(data, as_json, show.conversation(data, state, mtime))


@main.command()
@click.argument("conversation")
@click.pass_context
def cancel(ctx: click.Context, conversation: str) -> None:
    """Stop the in-flight generation and mark the turn cancelled."""
    home = _home(ctx)
    conv = find_conversation(home, conversation, include_completed=False)
    state = read_state(conv)
    if actions.cancel(conv) is None:
        now = state.status.value if state else "pending"
        click.echo(f"nothing to cancel: {conv.id} is {now} (no turn is running or retrying)")
        return
    if not daemon_alive(home):
        click.echo(
            "note: no daemon is running; the turn will be marked cancelled when one starts",
            err=True,
        )
    click.echo(f"cancel requested for {conv.id}")


@main.command("archive")
@click.argument("conversation")
@click.pass_context
def archive_(ctx: click.Context, conversation: str) -> None:
    """Move a conversation to completed/."""
    home = _home(ctx)
    conv = find_conversation(home, conversation, include_completed=False)
    dest = archive_conversation(home, conv)
    click.echo(str(dest.dir))


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
    """Run the daemon in the foreground."""
    from contemplation import daemon

    overrides = ctx.ensure_object(dict).setdefault("overrides", {})
    if dashboard_port is not None:
        overrides["dashboard_port"] = dashboard_port
    if no_dashboard:
        overrides["dashboard_enabled"] = False
    s = _settings(ctx)
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

    mcp_server.run(_settings(ctx), http_port=http_port)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the home, the config and every configured backend."""
    s = _settings(ctx)
    home = Home(s.home)
    results: list[dict[str, Any]] = []

    def add(name: str, ok: bool, detail: str) -> None:
        results.append({"check": name, "ok": ok, "detail": detail})

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

    in_use = {m.backend for c in list_conversations(home) if (m := read_metadata(c)) is not None}

    async def probe_backends() -> None:
        for c in await backends.check_all(s, extra=sorted(in_use)):
            add(c.name, c.ok, c.detail + "".join(f"\n    hint: {h}" for h in c.hints))

    asyncio.run(probe_backends())
    ok = all(r["ok"] for r in results)
    if as_json:
        _emit({"ok": ok, "checks": results}, True, "")
    else:
        for r in results:
            click.echo(f"{'ok ' if r['ok'] else 'FAIL'} {r['check']:<8} {r['detail']}")
    sys.exit(0 if ok else 1)


main.add_command(service_group)
main.add_command(routes)

if __name__ == "__main__":  # pragma: no cover
    main()
