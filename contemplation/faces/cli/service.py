"""``contemplation service install|uninstall|status|logs|reload``: the daemon as a user
service."""

from __future__ import annotations

import sys
from typing import Any

import click

from contemplation.faces import service
from contemplation.faces.cli.common import ctx_settings, emit, json_option
from contemplation.store.layout import Home

MANAGERS = click.Choice(["auto", "systemd", "launchd"])


def _manager(name: str) -> service.Manager:
    return service.default_manager() if name == "auto" else name  # type: ignore[return-value]


def _plan(
    ctx: click.Context, action: str, manager: str, dry_run: bool, **kw: Any
) -> service.Plan | None:
    """The plan for ``action``; with ``--print`` it is shown and None is returned (do nothing)."""
    p = service.plan(ctx_settings(ctx), action, _manager(manager), **kw)
    if dry_run:
        click.echo(p.describe(), nl=False)
        return None
    return p


def _options(fn: Any) -> Any:
    fn = click.option(
        "--print",
        "dry_run",
        is_flag=True,
        help="Show what would be written and run; change nothing.",
    )(fn)
    fn = click.option(
        "--manager", type=MANAGERS, default="auto", show_default=True, help="Service manager."
    )(fn)
    return fn


@click.group("service")
def service_group() -> None:
    """Run the daemon as a user service (systemd --user on Linux, a LaunchAgent on macOS)."""


@service_group.command()
@_options
@click.pass_context
def install(ctx: click.Context, manager: str, dry_run: bool) -> None:
    """Write the unit (absolute paths) and start it; running it again is safe."""
    p = _plan(ctx, "install", manager, dry_run)
    if p is not None:
        for line in service.install(p):
            click.echo(line)


@service_group.command()
@_options
@click.pass_context
def uninstall(ctx: click.Context, manager: str, dry_run: bool) -> None:
    """Stop the service and remove the unit; conversations are kept."""
    p = _plan(ctx, "uninstall", manager, dry_run)
    if p is not None:
        for line in service.uninstall(p):
            click.echo(line)


@service_group.command()
@_options
@json_option(
    'Print {"manager", "unit_file", "installed", "loaded", "active", "state", "pid", '
    '"daemon_running"} as JSON.'
)
@click.pass_context
def status(ctx: click.Context, manager: str, dry_run: bool, as_json: bool) -> None:
    """The service manager's view of the daemon."""
    if as_json and not dry_run:
        from contemplation.faces import service_status

        home = Home(ctx_settings(ctx).home)
        emit(service_status.status(_manager(manager), home), True, "")
        return
    p = _plan(ctx, "status", manager, dry_run)
    if p is not None:
        sys.exit(service.passthrough(p))


@service_group.command()
@_options
@click.option(
    "-n", "--lines", type=click.IntRange(min=1), default=200, show_default=True, help="How many."
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows.")
@click.pass_context
def logs(ctx: click.Context, manager: str, dry_run: bool, lines: int, follow: bool) -> None:
    """The daemon's log (journalctl, or the LaunchAgent's log files)."""
    p = _plan(ctx, "logs", manager, dry_run, lines=lines, follow=follow)
    if p is not None:
        sys.exit(service.passthrough(p))


@service_group.command()
@click.pass_context
def reload(ctx: click.Context) -> None:
    """Make the running daemon re-read its configuration (SIGHUP): turns in flight finish,
    new turns use the new settings. The file is checked first, as the daemon checks it: a
    bad one is refused here (exit 1, with the reason) and the old settings kept."""
    import os
    import signal

    from contemplation.base.exits import fail
    from contemplation.config.reload import load_new
    from contemplation.config.validate import validate
    from contemplation.errors import ContemplationError
    from contemplation.store.layout import Home, read_json
    from contemplation.writer import daemon_alive

    settings = ctx_settings(ctx)
    try:  # the check the daemon makes on SIGHUP (and doctor's): a refusal is said here
        load_new(lambda: settings, validate)
    except ContemplationError as exc:
        fail(f"not reloaded: {exc} (the daemon keeps the settings it runs with)")
    home = Home(settings.home)
    info = read_json(home.daemon_info) or {}
    pid = info.get("pid")
    if not daemon_alive(home) or not isinstance(pid, int):
        fail(f"no daemon is running on {home.root}: nothing to reload")
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        fail(f"the daemon (pid {pid}) is gone: nothing to reload")
    click.echo(
        f"asked the daemon (pid {pid}) to reload its settings; its log says what changed "
        "(`contemplation service logs`, or stderr of `contemplation run`)"
    )
