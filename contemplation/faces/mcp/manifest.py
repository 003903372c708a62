"""The answers :mod:`contemplation.faces.mcp.front` gives before the SDK server is loaded,
captured from that server: ``initialize`` for each protocol version a client may ask for
(and for one it does not know), and ``tools/list``. ``scripts/mcp_manifest.py`` writes them
to ``manifest.json``; a test captures them again and fails while the file differs, so the
early answers are the SDK's own, byte for byte in meaning.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

from contemplation import __version__
from contemplation import settings as settings_mod
from contemplation.faces.mcp.front import UNKNOWN_VERSION
from contemplation.faces.mcp.server import build_server, serve_stdio
from contemplation.settings import Settings

NOT_A_VERSION = "1970-01-01"  # a version no SDK knows: the answer to UNKNOWN_VERSION


class _Kept:
    """The server's stdout: each answer by its request's id."""

    def __init__(self, last: object) -> None:
        self.answers: dict[object, Any] = {}
        self.last = last
        self.done = anyio.Event()

    async def write(self, text: str) -> None:
        msg = json.loads(text)
        self.answers[msg.get("id")] = msg.get("result", msg.get("error"))
        if msg.get("id") == self.last:
            self.done.set()

    async def flush(self) -> None:
        return None


async def _script(lines: list[dict[str, Any]], kept: _Kept) -> AsyncIterator[str]:
    """The server's stdin: the lines, then the end once the last one is answered."""
    for line in lines:
        yield json.dumps(line)
    with anyio.fail_after(60):
        await kept.done.wait()


async def _session(settings: Settings, version: str) -> tuple[Any, Any]:
    hello = {"protocolVersion": version, "capabilities": {}}
    lines: list[dict[str, Any]] = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {**hello, "clientInfo": {"name": "manifest", "version": "1"}},
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    kept = _Kept(2)
    await serve_stdio(build_server(settings), _script(lines, kept), kept)
    return kept.answers[1], kept.answers[2]


def capture() -> dict[str, Any]:
    """The manifest, from a server over an empty home of its own."""
    with tempfile.TemporaryDirectory() as home:
        settings = settings_mod.load(home=Path(home), env={}, config=None)  # no config read
        initialize: dict[str, Any] = {}
        tools: Any = None
        for asked in (*KNOWN_PROTOCOL_VERSIONS, NOT_A_VERSION):
            answer, tools = anyio.run(_session, settings, asked)
            initialize[UNKNOWN_VERSION if asked == NOT_A_VERSION else asked] = answer
    from importlib.metadata import version

    return {
        "contemplation": __version__,
        "mcp": version("mcp"),
        "initialize": initialize,
        "tools/list": tools,
    }
