"""The answers :mod:`contemplation.faces.mcp.front` gives before the SDK server is loaded,
captured from that server: ``initialize`` for each protocol version a client may ask for
(and for one it does not know) and ``tools/list``; for the stateless protocol (2026-07-28,
which Claude Code speaks first), ``server/discover``, ``tools/list``, ``prompts/list``,
``resources/list`` (the server's own resources: none; the conversations come once the
server is loaded) and a listen's acknowledgement.
``scripts/mcp_manifest.py`` writes them to ``manifest.json``; a test captures them again and
fails while the file differs, so the early answers are the SDK's own, byte for byte in
meaning.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from contemplation import __version__
from contemplation.faces.mcp.front import (
    ACKNOWLEDGED,
    LISTEN,
    LISTENED,
    SUBSCRIPTION_KEY,
    UNKNOWN_VERSION,
    canonical,
)
from contemplation.faces.mcp.server import build_server, serve_stdio
from contemplation.faces.mcp.surely import VERSION_KEY
from contemplation.settings import Settings, load

NOT_A_VERSION = "1970-01-01"  # a version no SDK knows: the answer to UNKNOWN_VERSION


class _Kept:
    """The server's stdout: each answer by its request's id, each listen's acknowledgement
    by its subscription's; done once ``last`` is answered and ``acked`` acknowledged."""

    def __init__(self, last: object, acked: object = None) -> None:
        self.answers: dict[object, Any] = {}
        self.acks: dict[object, Any] = {}
        self.last, self.acked = last, acked
        self.done = anyio.Event()

    async def write(self, text: str) -> None:
        msg = json.loads(text)
        if msg.get("method") == ACKNOWLEDGED:
            params = dict(msg["params"])
            sid = params.pop("_meta", {}).get(SUBSCRIPTION_KEY)
            self.acks[sid] = params
        elif "id" in msg:
            self.answers[msg["id"]] = msg.get("result", msg.get("error"))
        if self.last in self.answers and (self.acked is None or self.acked in self.acks):
            self.done.set()

    async def flush(self) -> None:
        return None


async def _script(lines: list[dict[str, Any]], kept: _Kept) -> AsyncIterator[str]:
    """The server's stdin: the lines, then the end once the last one is answered."""
    for line in lines:
        yield json.dumps(line)
    with anyio.fail_after(60):
        await kept.done.wait()


#: what the front answers of the stateless protocol (each request carries its version)
MODERN_EARLY = ("server/discover", "tools/list", "prompts/list", "resources/list")


async def _answers(settings: Settings, lines: list[dict[str, Any]], acked: object) -> _Kept:
    kept = _Kept(lines[-1]["id"], acked)
    await serve_stdio(build_server(settings), _script(lines, kept), kept)
    return kept


def modern(settings: Settings, version: str, client: dict[str, Any]) -> dict[str, Any]:
    """The answers to :data:`MODERN_EARLY` for a client whose per-request ``_meta`` is
    ``client`` (its info and capabilities)."""
    meta = {"_meta": {VERSION_KEY: version, **client}}
    listen = {**meta, "notifications": LISTENED}
    lines: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": "listen", "method": LISTEN, "params": listen},
        *(
            {"jsonrpc": "2.0", "id": n, "method": method, "params": meta}
            for n, method in enumerate(MODERN_EARLY)
        ),
    ]
    kept = anyio.run(_answers, settings, lines, "listen")
    table: dict[str, Any] = {method: kept.answers[n] for n, method in enumerate(MODERN_EARLY)}
    table[LISTEN] = {canonical(LISTENED): kept.acks["listen"]}
    return table


CLIENT = {
    "io.modelcontextprotocol/clientInfo": {"name": "manifest", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def handshake(settings: Settings, version: str) -> tuple[Any, Any]:
    """The answers to ``initialize`` asking for ``version``, and to ``tools/list`` after it."""
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
    kept = anyio.run(_answers, settings, lines, None)
    return kept.answers[1], kept.answers[2]


def capture() -> dict[str, Any]:
    """The manifest, from a server over an empty home of its own."""
    with tempfile.TemporaryDirectory() as home:
        settings = load(home=Path(home), env={}, config=None)  # no config read
        initialize: dict[str, Any] = {}
        tools: Any = None
        for asked in (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS, NOT_A_VERSION):
            answer, tools = handshake(settings, asked)
            initialize[UNKNOWN_VERSION if asked == NOT_A_VERSION else asked] = answer
        stateless = {v: modern(settings, v, CLIENT) for v in MODERN_PROTOCOL_VERSIONS}
    from importlib.metadata import version

    return {
        "contemplation": __version__,
        "mcp": version("mcp"),
        "initialize": initialize,
        "tools/list": tools,
        "modern": stateless,
    }
