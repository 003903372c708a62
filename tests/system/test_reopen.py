"""Continuing a finished conversation: ``reopen`` (and MCP ``conversation_reopen``)
brings an archived conversation back; archive-on-COMPLETE happens once, when the marker is
first seen, so a folder reopened or moved back by hand stays in active/ and its next message
is a turn as any other. A real daemon against the scripted fake Ollama, the real CLI."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable

from mcp import Client

from contemplation.faces.mcp import server as mcp_server
from contemplation.store.layout import Home
from tests.conftest import DaemonProc, base_env, cli_here, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_mcp_server import settings_for, tool


def test_reopen_and_a_folder_moved_back_by_hand_stay_and_continue(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(
        Step(text="Done.\n=== COMPLETE ==="),
        Step(text="Continued once."),
        Step(text="Continued twice."),
        Step(text="Finished again.\n=== COMPLETE ==="),
    )
    conv_id = cli_here(env, "new", "finish", "--message", "finish it").stdout.strip()
    archived = home.completed / conv_id
    wait_for(archived.is_dir, 30, what="archived on COMPLETE")
    refused = cli_here(env, "send", conv_id, "more", check=False)
    assert refused.returncode == 1 and f"contemplation reopen {conv_id}" in refused.stderr

    assert cli_here(env, "reopen", conv_id).stdout.strip() == str(home.active / conv_id)
    once = cli_here(env, "send", conv_id, "go on", "--wait", "--timeout", "30", check=False)
    assert once.returncode == 0, once.stderr
    assert once.stdout.rstrip().endswith("Continued once.")
    assert (home.active / conv_id).is_dir() and not archived.exists()  # not archived again

    # archived by hand ... and moved back by hand: it stays too
    cli_here(env, "archive", conv_id)
    shutil.move(str(archived), str(home.active / conv_id))
    twice = cli_here(env, "send", conv_id, "and on", "--wait", "--timeout", "30", check=False)
    assert twice.returncode == 0 and twice.stdout.rstrip().endswith("Continued twice.")
    assert (home.active / conv_id).is_dir()

    # a new COMPLETE archives it again, once
    cli_here(env, "send", conv_id, "now finish", "--wait", "--timeout", "30")
    wait_for(archived.is_dir, 30, what="archived on the new COMPLETE")
    again = cli_here(env, "reopen", conv_id + "x", check=False)
    assert again.returncode == 1
    active = cli_here(env, "reopen", conv_id)
    assert active.returncode == 0
    assert "is active already" in cli_here(env, "reopen", conv_id, check=False).stderr


def test_conversation_reopen_over_mcp(home: Home) -> None:
    from contemplation.store.templates import load_template
    from contemplation.writer import archive, new_conversation

    conv = new_conversation(
        home, "mcp", template=load_template(home, "default"), model="m", backend="ollama"
    )
    archive(home, conv)

    async def script(c: Client) -> dict[str, object]:
        return await tool(c, "conversation_reopen", conversation_id=conv.id)

    async def main() -> dict[str, object]:
        async with Client(mcp_server.build_server(settings_for(home))) as client:
            return await script(client)

    out = asyncio.run(main())
    assert out == {
        "conversation_id": conv.id,
        "archived": False,
        "path": str(home.active / conv.id),
    }
    assert (home.active / conv.id).is_dir() and not (home.completed / conv.id).exists()
