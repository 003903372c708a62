"""``contemplation install claude-code|claude-desktop``: this installation into Claude, one step."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import click

from contemplation.base.exits import fail
from contemplation.faces import claude


def _where(ctx: click.Context) -> dict[str, Any]:
    obj = ctx.find_root().obj or {}
    return {"home": obj.get("home"), "config": obj.get("config")}


@click.group("install")
def install() -> None:
    """Install contemplation into Claude Code (a plugin) or Claude Desktop (a bundle)."""


@install.command("claude-code")
@click.option(
    "--dir",
    "dest",
    type=click.Path(path_type=Path),
    help="Where the plugin's local marketplace is written "
    "(default: $XDG_DATA_HOME/contemplation-claude).",
)
@click.option("--with-hook", is_flag=True, help="Add the hook that reminds Claude of local models.")
@click.option(
    "--with-rewake",
    is_flag=True,
    help="Add the Stop hook that wakes Claude when a reply it awaits is done (asyncRewake).",
)
@click.option(
    "--scope",
    type=click.Choice(["user", "project", "local"]),
    default="user",
    show_default=True,
    help="Claude Code's installation scope.",
)
@click.option("--claude", "claude_bin", help="The claude command (default: claude on the PATH).")
@click.pass_context
def claude_code(  # noqa: PLR0917 - click passes every option positionally
    ctx: click.Context,
    dest: Path | None,
    with_hook: bool,
    with_rewake: bool,
    scope: str,
    claude_bin: str | None,
) -> None:
    """Write the Claude Code plugin (MCP server, skill, opt-in hook) and install it."""
    dest = (dest or claude.default_dir()).expanduser().absolute()
    plugin = claude.write_plugin(
        dest, claude.server_command(**_where(ctx)), with_hook=with_hook, with_rewake=with_rewake
    )
    click.echo(f"wrote the plugin to {plugin}" + (" (with the reminder hook)" if with_hook else ""))
    found = claude_bin or shutil.which("claude")
    cmd = claude.claude_install(found or "claude", dest, scope)
    if found is None:
        fail(f"claude is not on the PATH; install the plugin with: {' '.join(cmd)}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except OSError as e:
        fail(f"cannot run {found} ({e.strerror}); install the plugin with: {' '.join(cmd)}")
    click.echo((done.stdout + done.stderr).strip())
    if done.returncode != 0:
        fail(f"`{' '.join(cmd)}` failed (exit {done.returncode})")
    click.echo("start a new Claude Code session (or /reload-plugins) to use it")


@install.command("claude-desktop")
@click.option(
    "--bundle",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("contemplation.mcpb"),
    show_default=True,
    help="The .mcpb file to write.",
)
@click.pass_context
def claude_desktop(ctx: click.Context, bundle: Path) -> None:
    """Build a Claude Desktop bundle (.mcpb) that runs this installation's MCP server."""
    path = claude.write_bundle(bundle, **_where(ctx))
    click.echo(f"wrote {path}")
    click.echo("open it with Claude Desktop (double-click, or Settings > Extensions) to install it")
