"""The commands that run or check the daemon and its faces: run, mcp, doctor. Loaded only
when one of them runs (see :mod:`contemplation.faces.cli.root`)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import click

from contemplation import backends
from contemplation.backends.catalog import in_use
from contemplation.base.exits import disk_full
from contemplation.base.privacy import open_mode
from contemplation.errors import ConfigError
from contemplation.faces.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    ctx_settings,
    emit,
    json_option,
)
from contemplation.settings import Settings
from contemplation.store.layout import Home, refused_folders
from contemplation.writer import daemon_alive, ensure_home, probe_writable


@click.command()
@click.option(
    "--once",
    is_flag=True,
    help="Process whatever is pending, then exit (1 when a conversation could not be done).",
)
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
    from contemplation.daemon import root as daemon

    overrides = ctx.ensure_object(dict).setdefault("overrides", {})
    if dashboard_port is not None:
        overrides["dashboard_port"] = dashboard_port
    if no_dashboard:
        overrides["dashboard_enabled"] = False
    s = ctx_settings(ctx)
    from contemplation.daemon.index_keeper import keep_index

    extras: list[daemon.Extra] = [keep_index]
    if s.dashboard_enabled:
        from contemplation.faces.dashboard import serve_dashboard

        extras.append(serve_dashboard)
    if s.notifications:
        from contemplation.daemon.notify import run_notifications

        extras.append(run_notifications)
    obj = ctx.find_root().ensure_object(dict)

    def loader() -> Settings:  # SIGHUP: the same sources, read anew
        from contemplation import settings

        return settings.load(
            config=obj.get("config"), home=obj.get("home"), overrides=obj.get("overrides") or {}
        )

    code = asyncio.run(
        daemon.run_once(s) if once else daemon.serve(s, extras=extras, loader=loader)
    )
    sys.exit(code)


def _check_home(s: Settings, home: Home, add: Callable[..., None]) -> None:
    """doctor's rows for the home (made, written to) and for the home or the config file
    open to the group or others: the config holds api keys and passwords, the home what the
    lookups read. Their modes are read first: ensure_home leaves an existing folder's alone."""
    config = open_mode(s.config_file) if s.config_file is not None else None
    if config is not None:
        add(
            "config",
            True,
            f"{s.config_file} is open to others (mode {config:o}), and api keys and passwords "
            f"live there: run `chmod 600 {s.config_file}`",
            warn=True,
        )
    mode = open_mode(home.root)
    try:
        ensure_home(home)
        probe_writable(home)
        add("home", True, f"{home.root} is writable")
    except OSError as exc:
        add("home", False, f"{home.root}: {'the disk is full' if disk_full(exc) else exc}")
    if mode is not None:
        add(
            "home",
            True,
            f"{home.root} is open to others (mode {mode:o}): run `chmod 700 {home.root}` "
            "(the daemon does it when it starts)",
            warn=True,
        )


def _check_config(s: Settings, add: Callable[..., None]) -> bool:
    """doctor's row for the config: the very check `run` makes at start (and a reload). False
    when it fails: then no reload is suggested, as it would be refused."""
    from contemplation.config.validate import validate

    try:
        validate(s)
    except ConfigError as exc:
        add("config", False, str(exc))
        return False
    add("config", True, str(s.config_file) if s.config_file else "defaults (no config file)")
    return True


@click.command()
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

    from contemplation.config.validate import unset_sources
    from contemplation.faces.cli import probe

    # each plugin loaded in a child first: one that ends or hangs its process is named, and
    # kept out of this one (the checks below load the others)
    probed = probe.probe()
    valid = _check_config(s, add)
    for line in unset_sources(s):  # the model is told only that the source is not there
        add("template", True, line, warn=True)
    _check_home(s, home, add)
    from contemplation.config.reload import drift

    differs = drift(home, s, valid=valid)
    if differs:
        add("daemon", True, differs, warn=True)
    from contemplation.faces import service

    carried = service.drift(service.default_manager())  # the shell's OPENAI_*, OLLAMA_HOST...
    if carried:
        add("service", True, carried, warn=True)
    for where, why in refused_folders(home):
        add("folders", True, f"{where} is not taken: {why}", warn=True)
    from contemplation.store.openfiles import being_written_at

    for conv_id, name in being_written_at(home):  # left in the inbox until closed
        detail = f"{conv_id}/inbox/{name} is still being written (open for writing)"
        add("inbox", True, f"{detail}: the daemon takes it once it is closed", warn=True)
    from contemplation.faces.dashboard import cards
    from contemplation.needs.tools import registry
    from contemplation.prompt import context_kinds

    failed = (
        *backends.failures(), *registry.failures(), *context_kinds.failures(),
        *cards.failures(),
    )  # fmt: skip
    for where, why in failed:  # it starts without them
        add("plugin", False, f"{where} was not loaded: {why}")
    for where, took in probe.slow(probed):
        add("plugin", True, f"{where} took {took:.1f} s to load (a start waits for it)", warn=True)
    add(
        "daemon",
        True,
        "running" if daemon_alive(home) else "not running (start: contemplation run)",
    )

    used = in_use(home)
    servers = {*backends.available(), *s.providers}  # a check of one of these is a server's
    for name in list(used):  # a conversation on an alias uses each of its providers
        alias = s.aliases.get(name)
        used |= set(alias.providers) if alias is not None else set()

    async def probe_backends() -> None:
        for c in await backends.check_all(s, extra=sorted(used)):
            detail = c.detail + "".join(f"\n    hint: {h}" for h in c.hints)
            if c.ok or c.name in used or c.name not in servers:
                add(c.name, c.ok, detail, warn=c.warn)  # (a model or other check: stands)
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
