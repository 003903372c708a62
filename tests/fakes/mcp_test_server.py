"""A tiny real MCP server for the client tests: stdio or streamable HTTP.

Tools: ``pid`` (its process id), ``sleep`` (waits, then answers), ``echo``, ``fail`` (a tool
error), ``roots`` (the roots the client advertised, or "no roots"), ``big`` (a long answer).

    python -m tests.fakes.mcp_test_server [--http PORT]
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("contemplation-test")


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
async def sleep(seconds: float, marker: str = "") -> str:
    """Wait, then answer; ``marker``: a file to create (with the pid) when the call starts."""
    if marker:
        with open(marker, "a", encoding="utf-8") as f:  # noqa: ASYNC230 - a tiny test write
            f.write(f"{os.getpid()}\n")
    await asyncio.sleep(seconds)
    return f"slept {seconds} in {os.getpid()}"


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
def fail(text: str = "") -> str:
    """Always fails."""
    raise ValueError(f"this tool always fails ({text})")


@server.tool()
def big(n: int = 10000) -> str:
    """A long answer of n characters."""
    return "x" * n


@server.tool()
async def roots(ctx: Context) -> str:
    """The roots the client advertised."""
    try:
        result = await ctx.session.list_roots()
    except Exception as exc:
        return f"no roots ({type(exc).__name__})"
    return ",".join(str(r.uri) for r in result.roots) or "no roots"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
