"""``contemplation models``: each configured backend's models and what they can do (tools,
thinking, vision, context window) as the capability registry resolves them
(:mod:`contemplation.backends.capabilities`: config, then the server, then the family table).

A backend that cannot be reached is one line saying why, with what to do; the others are
still listed. Added to the main group with ``main.add_command(models)``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from contemplation.backends.catalog import alias_rows, configured, in_use, list_all
from contemplation.base.terminal import safe
from contemplation.faces.cli import show
from contemplation.faces.cli.common import EXIT_ERROR, ctx_settings, emit, json_option
from contemplation.store.layout import Home


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _context(row: dict[str, Any]) -> str:
    ctx, window = row.get("context_length"), row.get("request_window")
    text = str(ctx) if ctx else "?"
    if window and window != ctx:
        text += f" ({window} per request)"
    return text


def human(listing: list[dict[str, Any]]) -> str:
    rows: list[tuple[str, ...]] = []
    for entry in listing:
        for m in entry.get("models", []):
            if "error" in m:
                rows.append((entry["backend"], m["name"], "?", "?", "?", "?", "?", m["error"]))
                continue
            rows.append(
                (
                    entry["backend"],
                    m["name"],
                    _yes(m["tools"]),
                    _yes(m["thinking"]),
                    _yes(m["vision"]),
                    _context(m),
                    str(entry.get("slots", "?")),
                    m["source"],
                )
            )
        if entry.get("more"):
            rows.append((entry["backend"], f"… and {entry['more']} more", *[""] * 6))
        if entry.get("ok") and not entry.get("models"):
            rows.append((entry["backend"], "(no models)", *[""] * 6))
    if not rows:
        return ""
    header = ("BACKEND", "MODEL", "TOOLS", "THINKING", "VISION", "CONTEXT", "SLOTS", "FROM")
    return show.table(rows, header)


@click.command()
@click.option(
    "--backend",
    "-b",
    "asked",
    multiple=True,
    help="Only this backend (repeatable). Default: the default backend, its fallbacks and "
    "those the active conversations use.",
)
@json_option('Print {"backends": [{"backend", "ok", "models" | "error"}]} as JSON.')
@click.pass_context
def models(ctx: click.Context, asked: tuple[str, ...], as_json: bool) -> None:
    """Each configured backend's models: tools, thinking, vision, context window.

    What a model can do comes from the config's [capabilities."<model>"], else the server,
    else the family table. A backend that cannot be reached is one line on stderr and the
    exit code is 1 when you asked for it (-b) or a conversation uses it; the others are
    still listed."""
    s = ctx_settings(ctx)
    listing = asyncio.run(list_all(s, configured(s, asked)))
    needed = set(asked) or in_use(Home(s.home))
    if as_json:
        emit({"backends": listing}, True, "")
    else:
        table = human(listing)
        if table:
            click.echo(table)
        for entry in listing:
            if not entry["ok"]:
                click.echo(safe(f"{entry['backend']}: {entry['error']}"), err=True)
            elif entry.get("slots_from"):
                click.echo(f"{entry['backend']}: {entry['slots']} slot(s), {entry['slots_from']}")
            for m in entry.get("models", []):
                if m.get("cannot_chat"):
                    click.echo(
                        safe(
                            f"{entry['backend']}: {m['name']} cannot chat ({m['cannot_chat']}): "
                            "a conversation with it is refused"
                        )
                    )
    if any(not e["ok"] and e["backend"] in needed for e in listing):
        sys.exit(EXIT_ERROR)


@click.command()
@json_option('Print {"aliases": [{"alias", "model", "providers", "options", "think"}]}.')
@click.pass_context
def aliases(ctx: click.Context, as_json: bool) -> None:
    """The model aliases of [aliases.*]: what --model names, and where it goes.

    An alias is a server's model over one or more providers, with options and think; a
    turn takes a free slot on any of its providers, the least busy first, and goes to
    another when one fails. `contemplation models` shows each provider's slots."""
    rows = alias_rows(ctx_settings(ctx))
    if as_json:
        emit({"aliases": rows}, True, "")
        return
    if not rows:
        click.echo("no aliases ([aliases.<name>] in config.toml)")
        return
    table = [
        (
            r["alias"],
            r["model"],
            ", ".join(r["providers"]),
            " ".join(f"{k}={v}" for k, v in r["options"].items()) or "-",
            "-" if r["think"] is None else str(r["think"]).lower(),
        )
        for r in rows
    ]
    click.echo(show.table(table, ("ALIAS", "MODEL", "PROVIDERS", "OPTIONS", "THINK")))
