"""``contemplation memory``, ``state`` and ``templates``: the two stores the NEED tools read
(``Brain memory about …``, ``Current state of …``) and the conversation templates.

    contemplation memory add KEY TEXT|- [--tag T]     memory list | search QUERY | rm KEY
    contemplation state set THING TEXT|-               state show [THING] | rm THING
    contemplation templates                            templates show NAME [--topic T]

Every command takes ``--json``. A store file that is not in the format
docs/reference/format.md gives is one line on stderr naming the file and the problem
(exit 1); nothing is written over it.
Added to the main group with ``main.add_command(memory)`` & co.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from contemplation.base.terminal import safe
from contemplation.errors import ConfigError
from contemplation.faces.cli import show
from contemplation.faces.cli.common import (
    EXIT_ERROR,
    TEMPLATE,
    ctx_settings,
    emit,
    fail,
    json_option,
    quiet_logs_unless_verbose,
    text_arg,
)
from contemplation.models import Metadata
from contemplation.needs.tools.memory import MEMORY_FILE, STATE_FILE, Entry, JsonStore
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.store.templates import Template, load_template, template_dirs

LIST_VALUE_CHARS = 70  # a value is cut to this in `list` (the whole value: --json or show)
MAX_SEARCH_RESULTS = 100


def _store(ctx: click.Context, filename: str) -> JsonStore:
    s = ctx_settings(ctx)
    return JsonStore(Home(s.home), filename, durable=s.durability == "fsync")


def _short(text: str, limit: int = LIST_VALUE_CHARS) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _rows(entries: list[Entry]) -> str:
    rows = [(e.key, e.updated or "-", ",".join(e.tags) or "-", _short(e.value)) for e in entries]
    return show.table(rows, ("KEY", "UPDATED", "TAGS", "VALUE"))


def _added(store: JsonStore, entry: Entry, before: Entry | None) -> dict[str, Any]:
    """What `memory add` and `state set` print as JSON."""
    return {
        "added": before is None,
        "replaced": before.as_dict() if before else None,
        "entry": entry.as_dict(),
        "file": str(store.path),
    }


def _value(text: str) -> str:
    value = text_arg(text)
    return value[:-1] if text == "-" and value.endswith("\n") else value  # echo adds one


# --------------------------------------------------------------------------- memory


@click.group()
def memory() -> None:
    """The memory store (<home>/memory.json) that answers "NEED: Brain memory about …"."""


@memory.command("add")
@click.argument("key")
@click.argument("text")
@click.option("--tag", "-t", "tags", multiple=True, help="A tag (repeat for more); searched too.")
@json_option('Print {"added", "replaced", "entry", "file"} as JSON.')
@click.pass_context
def memory_add(
    ctx: click.Context, key: str, text: str, tags: tuple[str, ...], as_json: bool
) -> None:
    """Remember TEXT (or stdin for -) under KEY; an entry with the same KEY (case and spacing
    ignored) is replaced."""
    store = _store(ctx, MEMORY_FILE)
    entry, before = store.add(key, _value(text), tags=tags)
    emit(
        _added(store, entry, before),
        as_json,
        f"{'replaced' if before else 'added'} {entry.key!r} in {store.path}",
    )


@memory.command("list")
@click.option("--tag", "-t", default=None, help="Only the entries with this tag.")
@json_option('Print [{"key", "value", "updated", "tags"}] as JSON.')
@click.pass_context
def memory_list(ctx: click.Context, tag: str | None, as_json: bool) -> None:
    """Every entry, by key (values cut to one line; --json has them whole)."""
    store = _store(ctx, MEMORY_FILE)
    entries = [e for e in store.entries() if tag is None or tag in e.tags]
    if as_json:
        emit([e.as_dict() for e in entries], True, "")
    elif not entries:
        click.echo(f"no entries{f' tagged {tag!r}' if tag else ''} in {store.path}")
    else:
        click.echo(_rows(entries))


@memory.command("search")
@click.argument("query")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, MAX_SEARCH_RESULTS),
    default=5,
    show_default=True,
    help="Results at most.",
)
@json_option('Print [{"key", "value", "updated", "tags", "score"}] as JSON.')
@click.pass_context
def memory_search(ctx: click.Context, query: str, limit: int, as_json: bool) -> None:
    """The entries that match QUERY best, as "NEED: Brain memory about QUERY" finds them."""
    store = _store(ctx, MEMORY_FILE)
    hits = store.search(query, limit)
    if as_json:
        emit([{**e.as_dict(), "score": round(score, 3)} for score, e in hits], True, "")
    elif not hits:
        click.echo(safe(f"nothing in memory about {query!r} ({len(store.load())} entries)"))
    else:
        click.echo(_rows([e for _, e in hits]))


@memory.command("rm")
@click.argument("key")
@click.pass_context
def memory_rm(ctx: click.Context, key: str) -> None:
    """Forget the entry KEY (case and spacing ignored)."""
    _remove(ctx, MEMORY_FILE, key, "memory entry")


def _remove(ctx: click.Context, filename: str, key: str, what: str) -> None:
    store = _store(ctx, filename)
    if not store.delete(key):
        fail(safe(f"no {what} {key!r} in {store.path}"))
    click.echo(safe(f"removed {key!r} from {store.path}"))


# --------------------------------------------------------------------------- state


@click.group()
def state() -> None:
    """The current-state store (<home>/current-state.json) that answers
    "NEED: Current state of …"."""


@state.command("set")
@click.argument("thing")
@click.argument("text")
@json_option('Print {"added", "replaced", "entry", "file"} as JSON.')
@click.pass_context
def state_set(ctx: click.Context, thing: str, text: str, as_json: bool) -> None:
    """Record TEXT (or stdin for -) as the current state of THING."""
    store = _store(ctx, STATE_FILE)
    entry, before = store.add(thing, _value(text))
    emit(
        _added(store, entry, before),
        as_json,
        f"recorded the state of {entry.key!r} in {store.path}",
    )


@state.command("show")
@click.argument("thing", required=False)
@json_option('Print {"key", "value", "updated", "tags"} (a list without THING) as JSON.')
@click.pass_context
def state_show(ctx: click.Context, thing: str | None, as_json: bool) -> None:
    """The recorded state of THING (case and spacing ignored); without THING, every one."""
    store = _store(ctx, STATE_FILE)
    if thing is None:
        entries = store.entries()
        if as_json:
            emit([e.as_dict() for e in entries], True, "")
        else:
            click.echo(_rows(entries) if entries else f"no state recorded in {store.path}")
        return
    entry = store.get(thing)
    if entry is None:
        known = ", ".join(e.key for e in store.entries()[:20])
        fail(safe(f"no state recorded for {thing!r}" + (f" (recorded: {known})" if known else "")))
    when = f" (recorded {entry.updated})" if entry.updated else ""
    emit(entry.as_dict(), as_json, f"{entry.key}{when}:\n{entry.value}")


@state.command("rm")
@click.argument("thing")
@click.pass_context
def state_rm(ctx: click.Context, thing: str) -> None:
    """Forget the recorded state of THING."""
    _remove(ctx, STATE_FILE, thing, "state recorded for")


# --------------------------------------------------------------------------- templates


@click.group(invoke_without_command=True)
@json_option(
    'Print [{"name", "model", "backend", "description", "prompt_mode", "where", "shipped", '
    '"error"}] as JSON.'
)
@click.pass_context
def templates(ctx: click.Context, as_json: bool) -> None:
    """The conversation templates: the home's (<home>/templates/NAME/) and the shipped ones it
    does not override. A template that cannot be used is listed with its error (exit 1)."""
    if ctx.invoked_subcommand is not None:
        return
    settings = ctx_settings(ctx)
    home = Home(settings.home)
    rows = [_template_row(settings, home, n, *where) for n, where in template_dirs(home).items()]
    if as_json:
        emit(rows, True, "")
    else:
        table = [
            (
                r["name"],
                r["model"] or "-",
                r["backend"] or "-",
                f"error: {r['error']}" if r["error"] else r["description"] or "-",
                "shipped" if r["shipped"] else r["where"],
            )
            for r in rows
        ]
        click.echo(show.table(table, ("NAME", "MODEL", "BACKEND", "DESCRIPTION", "WHERE")))
    broken = [r for r in rows if r["error"]]
    for r in broken:
        click.echo(safe(f"error: template {r['name']}: {r['error']}"), err=True)
    if broken:
        sys.exit(EXIT_ERROR)


def _template_row(
    settings: Settings, home: Home, name: str, folder: Path, shipped: bool
) -> dict[str, Any]:
    from contemplation.config.validate import check_template

    row: dict[str, Any] = {
        "name": name,
        "model": None,
        "backend": None,
        "description": "",
        "prompt_mode": None,
        "where": str(folder),
        "shipped": shipped,
        "error": None,
    }
    try:
        tpl = load_template(home, name)
        check_template(tpl, settings)
    except ConfigError as exc:
        row["error"] = str(exc)
        return row
    row.update(
        model=tpl.model,
        backend=tpl.backend,
        description=tpl.description,
        prompt_mode=tpl.prompt_mode,
    )
    return row


@templates.command("show")
@click.argument("name", type=TEMPLATE)
@click.option(
    "--topic",
    default="<topic>",
    show_default=True,
    help="The topic the system prompt below is shown for.",
)
@json_option("Print the template's settings and its system prompt as JSON.")
@click.pass_context
def templates_show(ctx: click.Context, name: str, topic: str, as_json: bool) -> None:
    """A template's settings, and the system prompt a conversation made from it gets (with
    the NEED forms this configuration can answer)."""
    from contemplation.config.validate import check_template

    quiet_logs_unless_verbose(ctx)
    settings = ctx_settings(ctx)
    home = Home(settings.home)
    tpl = load_template(home, name)
    check_template(tpl, settings)
    data = _template_data(tpl, settings.default_model, settings.default_backend)
    data["prompt"] = _prompt(ctx, tpl, topic)
    if as_json:
        emit(data, True, "")
        return
    click.echo(safe(_template_text(data)))


def _template_data(tpl: Template, model: str, backend: str) -> dict[str, Any]:
    return {
        "name": tpl.name,
        "where": str(tpl.folder) if tpl.folder else None,
        "shipped": tpl.shipped,
        "description": tpl.description,
        "model": tpl.model,
        "backend": tpl.backend,
        "uses": {"model": tpl.model or model, "backend": tpl.backend or backend},
        "options": tpl.options,
        "think": tpl.think,
        "archive_on_complete": tpl.archive_on_complete,
        "prompt_mode": tpl.prompt_mode,
        "context_requirements": list(tpl.context_requirements),
        "routes": tpl.extra.get("routes", []),
        "permissions": tpl.extra.get("permissions", {}),
        "system_prompt": tpl.system_prompt,
    }


def _prompt(ctx: click.Context, tpl: Template, topic: str) -> str:
    """The system prompt a conversation about ``topic`` made from ``tpl`` gets (without the
    context gathered at its start)."""
    from contemplation.needs.router import NeedRouter
    from contemplation.prompt.prompts import need_forms, system_prompt

    router = NeedRouter(ctx_settings(ctx))
    needs = need_forms(router.offered(tpl.name))
    meta = Metadata(id="example", topic=topic, created="", template=tpl.name)
    return system_prompt(meta, tpl.system_prompt, prompt_mode=tpl.prompt_mode, needs=needs)


def _template_text(data: dict[str, Any]) -> str:
    where = data["where"] + ("  (shipped with contemplation)" if data["shipped"] else "")
    uses = data["uses"]

    def said(key: str) -> str:
        return str(data[key]) if data[key] else f"{uses[key]} (from the config)"

    lines = [
        f"template     {data['name']}",
        f"where        {where}",
        f"description  {data['description'] or '-'}",
        f"model        {said('model')}",
        f"backend      {said('backend')}",
        f"options      {json.dumps(data['options'], ensure_ascii=False)}",
        f"think        {'-' if data['think'] is None else data['think']}",
        f"archive      {'no' if data['archive_on_complete'] is False else 'on COMPLETE'}",
        f"prompt_mode  {data['prompt_mode']}",
        f"routes       {len(data['routes'])} of its own (contemplation routes -t {data['name']})",
    ]
    reqs = data["context_requirements"]
    lines.append(f"context      {len(reqs)} requirement(s) gathered at the start")
    lines += [f"  - {json.dumps(r, ensure_ascii=False)}" for r in reqs]
    lines += ["", "system prompt as sent:", "-" * 40, data["prompt"], "-" * 40]
    return "\n".join(lines)


__all__ = ["memory", "state", "templates"]
