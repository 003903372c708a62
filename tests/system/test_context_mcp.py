"""Context assembly is fast with a real MCP server running (the peer mcp-server-time, in a
process of its own: a system test; the assembler's own tests are tests/unit/prompt/test_context.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from contemplation import settings as settings_mod
from contemplation.needs.router import NeedRouter
from contemplation.prompt.context import ContextAssembler, Section
from tests import peers
from tests.unit.prompt.test_context import REQUIREMENTS, world  # noqa: F401 (fixture)


def test_assembly_with_a_running_mcp_server_is_fast(
    world: dict[str, Any],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    time_cmd = peers.python_peer("mcp-server-time")
    settings = world["settings"].model_copy(
        update={
            "mcp_servers": {
                "time": settings_mod.McpServerSettings.model_validate({"command": str(time_cmd)}),
            },
            "routes": [{"prefix": "Time in", "tool": "time:get_current_time", "param": "timezone"}],
        }
    )
    reqs = [*REQUIREMENTS[:6], {"type": "need", "need": "Time in Europe/Berlin"}]

    async def main() -> tuple[list[Section], float]:
        async with NeedRouter(settings) as router:
            await router.pool.call("time", "get_current_time", {"timezone": "UTC"})  # warm
            ctx = ContextAssembler(router, durable=False)
            started = time.monotonic()
            sections, _ = await ctx.assemble(world["conv"], reqs)
            return sections, time.monotonic() - started

    sections, took = asyncio.run(main())
    assert "Europe/Berlin" in sections[-1].text
    assert took < 1.0
