"""``Search results for <query>``: whichever MCP tool ``tools.search_tool`` names.

Without one the answer says so plainly (an :class:`Unconfigured` error): there is no built-in
web search, and nothing is fetched from the network behind the user's back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contemplation.needs.tools.base import ToolResult, Unconfigured, fill, text_arg
from contemplation.needs.tools.mcp import McpPool

NOT_CONFIGURED = "no search tool is available"
SETUP_HINT = (
    'set tools.search_tool = "server:tool" (a tool of one of the [mcp_servers]) in the '
    "config, or add a [[routes]] rule for 'Search results for'"
)


class ConfiguredSearch:
    name = "web.search"

    def __init__(self, pool: McpPool, target: str, arguments: Mapping[str, Any]) -> None:
        self.pool = pool
        self.server, _, self.tool = target.partition(":")
        self.arguments = dict(arguments)

    @property
    def configured(self) -> bool:
        return bool(self.server and self.tool)

    @property
    def ready(self) -> bool:  # offered to the model only when a search server is set
        return self.configured

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        if not self.configured:
            raise Unconfigured(NOT_CONFIGURED, hint=SETUP_HINT)
        query = text_arg(arguments, "query")
        args = fill(self.arguments, {"query": query, "need": query, "rest": query})
        return await self.pool.call(self.server, self.tool, args)
