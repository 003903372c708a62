"""Tool arguments of ``contemplation mcp`` are checked over stdio too: the real SDK client
against the real server in a process of its own (the in-process checks of every tool are
tests/unit/faces/test_mcp_arguments.py; this one starts a process, so it is a system test)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env
from tests.unit.faces.test_mcp_arguments import ok, refused, two_exchanges

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_over_stdio_the_names_are_checked_too(home: Home) -> None:
    conv, _ = two_exchanges(home)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "contemplation", "mcp"], env=base_env(home), cwd=ROOT
    )

    async def main() -> tuple[str, dict[str, Any]]:
        async with Client(params) as c:
            bad = await refused(c, "conversation_check", conversation_id=conv.id, bogus=1)
            good = await ok(c, "conversation_check", conversation_id=conv.id, cursor=0)
            return bad, good

    bad, good = asyncio.run(main())
    assert bad.startswith("unknown argument 'bogus': this tool takes conversation_id, cursor")
    assert [b["text"] for b in good["blocks"]] == ["Step one.", "Step two."]
