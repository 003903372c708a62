"""``contemplation mcp``: the MCP server for agents.

Kept apart from the other commands and light at import: on stdio the wire is claimed and
``initialize`` answered before the settings or the MCP SDK are loaded
(:mod:`contemplation.faces.mcp.front`), so a client that spawns it (Claude Code) has the
tools before its first model request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from contemplation.faces.mcp.server import ContemplationServer


@click.command()
@click.option(
    "--http",
    "http_port",
    type=int,
    default=None,
    help="Serve streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio; every request needs "
    "the token in <home>/.mcp.token.",
)
@click.option(
    "--print-claude-command",
    is_flag=True,
    help="Print the `claude mcp add-json` line for --http PORT and exit (Claude Code reads "
    "the token through --print-headers, never from a command line).",
)
@click.option(
    "--print-headers",
    is_flag=True,
    help="Print the HTTP face's headers as JSON, token included, and exit (Claude Code's "
    "headersHelper).",
)
@click.pass_context
def mcp(
    ctx: click.Context, http_port: int | None, print_claude_command: bool, print_headers: bool
) -> None:
    """MCP server for agents (stdio by default)."""
    if http_port is None and not (print_claude_command or print_headers):
        from contemplation.faces.mcp import front

        front.serve(lambda: _server(ctx))
        return
    from contemplation.faces.cli.common import ctx_settings

    if print_headers:
        from contemplation.faces.mcp import connect

        connect.print_headers(ctx_settings(ctx))
        return
    from contemplation.faces.mcp import server

    if http_port is None:
        raise click.UsageError("--print-claude-command goes with --http PORT")
    if print_claude_command:
        server.print_claude_command(ctx_settings(ctx), http_port)
        return
    server.run_http(ctx_settings(ctx), http_port)


def _server(ctx: click.Context) -> ContemplationServer:
    from contemplation.faces.cli.common import ctx_settings
    from contemplation.faces.mcp.server import build_server

    return build_server(ctx_settings(ctx))
