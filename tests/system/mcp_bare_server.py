"""A bare MCP SDK stdio server of contemplation's tools: the reference of
``test_mcp_front_fuzz.py``. What ``MCPServer.run_stdio_async`` runs (the SDK's stdio
transport and serving loop over the server ``contemplation mcp`` builds), without the front
(:mod:`contemplation.faces.mcp.front`) and without the answers to unreadable lines
(:mod:`contemplation.faces.mcp.wire`).

One thing is added, for the test: at the end of its input it waits until each request it
read is answered (a listen: acknowledged, its stream stays open), then writes
``{"settled": true}`` (false after 30 s), then ends as the SDK ends (the open listens are
answered "Connection closed"). Without the wait the SDK's end would cancel what is still in
flight, and what is answered would be a race.

Run as ``python -P tests/system/mcp_bare_server.py`` with the test's environment.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.stdio import stdio_server
from mcp_types import JSONRPCRequest, jsonrpc_message_adapter

from contemplation.base.logs import configure
from contemplation.faces.mcp.server import build_server
from contemplation.settings import load

ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
SUBSCRIPTION_KEY = "io.modelcontextprotocol/subscriptionId"


def _key(rid: object) -> str:
    return json.dumps(rid)


class Track:
    """The requests read and not yet answered; the listens acknowledged."""

    def __init__(self) -> None:
        self.pending: Counter[str] = Counter()
        self.acked: set[str] = set()
        self.changed = anyio.Event()

    def settled(self) -> bool:
        return all(n <= 0 or key in self.acked for key, n in self.pending.items())

    def wrote(self, msg: Any) -> None:
        if isinstance(msg, dict) and ("result" in msg or "error" in msg) and "id" in msg:
            self.pending[_key(msg["id"])] -= 1
        if isinstance(msg, dict) and msg.get("method") == ACKNOWLEDGED:
            self.acked.add(_key(msg["params"]["_meta"][SUBSCRIPTION_KEY]))
        self.changed.set()
        self.changed = anyio.Event()


class In:
    """stdin as the SDK's transport reads it (text, universal newlines), each line noted."""

    def __init__(self, track: Track, out: Out) -> None:
        self.track, self.out = track, out
        self.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115

    def __aiter__(self) -> In:
        return self

    async def __anext__(self) -> str:
        line: str = await anyio.to_thread.run_sync(self.stdin.readline)
        if not line:
            with anyio.move_on_after(30):
                while not self.track.settled():
                    await self.track.changed.wait()
            await self.out.say({"settled": self.track.settled()})
            raise StopAsyncIteration
        try:
            msg = jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception:
            return line
        if isinstance(msg, JSONRPCRequest):
            self.track.pending[_key(msg.id)] += 1
        return line


class Out:
    def __init__(self, track: Track) -> None:
        self.track = track

    async def say(self, msg: object) -> None:
        await self.write(json.dumps(msg))

    async def write(self, text: str) -> None:
        sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()
        self.track.wrote(json.loads(text))

    async def flush(self) -> None:
        return None


async def main() -> None:
    settings = load()
    configure(settings.log_format, settings.log_level, human_lines=True)
    low = build_server(settings)._lowlevel_server
    track = Track()
    out = Out(track)
    async with stdio_server(In(track, out), out) as (read_stream, write_stream):  # type: ignore[arg-type]
        await low.run(read_stream, write_stream, low.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
