"""Approvals are the person's, outside tasks too: the real MCP SDK client (``ClientSession``
with an elicitation callback, over stdio to the real ``contemplation mcp`` process) waits with
``conversation_wait`` while a real daemon runs a turn whose lookup a ``[permissions]`` rule
marks ``ask``: the lookup comes to the person as an elicitation form, and their answer is the
decision, recorded as ``conversation_approve`` records one."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from contemplation.faces.reading import Reader
from contemplation.store.layout import Home, read_json
from tests.conftest import ROOT, DaemonProc, base_env
from tests.fakes.ollama_server import FakeOllama, Step

Answer = Callable[[types.ElicitRequestParams], types.ElicitResult]


def asking_setup(
    tmp_path: Path, home: Home, fake_ollama: FakeOllama
) -> tuple[dict[str, str], Path]:
    notes = tmp_path / "notes"
    notes.mkdir()
    secret = notes / "secret.md"
    secret.write_text("the launch code")
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\nread_file = {{ "*secret*" = "ask" }}\n'
    )
    env = base_env(
        home, fake_ollama, CONTEMPLATION_CONFIG=str(cfg), CONTEMPLATION_DASHBOARD_ENABLED="false"
    )
    return env, secret


async def converse(
    env: dict[str, str], answer: Answer | None, secret: Path
) -> tuple[dict[str, Any], list[types.ElicitRequestParams]]:
    """Start a conversation and wait for it once (45 s) through the SDK's own client."""
    asked: list[types.ElicitRequestParams] = []

    async def on_elicit(_: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        assert answer is not None
        return answer(params)

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "contemplation", "mcp"], env=env, cwd=str(ROOT)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, elicitation_callback=on_elicit if answer else None) as s,
    ):
        await s.initialize()
        started = await s.call_tool(
            "conversation_start",
            {"topic": "Ask", "initial_prompt": f"Read {secret}", "model": "gemma"},
        )
        cid = json.loads(getattr(started.content[0], "text", ""))["conversation_id"]
        waited = await s.call_tool("conversation_wait", {"conversation_id": cid, "timeout_s": 45})
        assert not waited.is_error, waited.content
        return json.loads(getattr(waited.content[0], "text", "")), asked


def test_a_lookup_marked_ask_is_asked_of_the_person_while_conversation_wait_waits(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(
        Step(text=f"NEED: File contents of {secret}"), Step(text="Thanks, I have read it.")
    )
    daemon_factory(env, home).wait_ready()

    def allow_once(params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "once"})

    out, asked = asyncio.run(converse(env, allow_once, secret))
    [form] = asked
    assert isinstance(form, types.ElicitRequestFormParams)
    assert str(secret) in form.message and "ask" in form.message  # what is read, and why
    choices = form.requested_schema["properties"]["decision"]["oneOf"]
    assert [c["const"] for c in choices] == ["once", "always", "reject"]
    # one wait: the decision went on, the lookup ran and the model's reply came back in it
    assert out["blocks"][-1]["text"] == "Thanks, I have read it.", out
    conv = Reader(home).locate(out["conversation_id"])
    assert "the launch code" in conv.log.read_text()
    meta = read_json(conv.metadata)
    assert meta is not None
    [decided] = meta["approvals"]
    assert decided["decision"] == "once" and decided["face"] == "mcp"  # as conversation_approve


def test_a_client_without_elicitation_keeps_conversation_approve(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"))
    daemon_factory(env, home).wait_ready()
    out, asked = asyncio.run(converse(env, None, secret))
    assert asked == []
    [item] = out["waiting"]
    assert item["kind"] == "approval" and "conversation_approve" in json.dumps(item)
