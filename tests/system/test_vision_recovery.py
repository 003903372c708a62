"""An image sent to a model that cannot see never breaks a conversation for good:
the ERROR says how to go on, the failed turn can be withdrawn (``retract``, MCP
``retract``), the model can be changed (``set-model``, MCP ``model``), and a history that
holds an older image goes to a model without vision without it, a NOTE saying so once. Run
with the real CLI and daemon (``run --once``) against the scripted fake Ollama."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from mcp import Client

from contemplation import settings as settings_mod
from contemplation.faces.mcp import server as mcp_server
from contemplation.models import MarkerKind, Status
from contemplation.store.layout import Home, read_metadata, read_state
from contemplation.writer import DaemonLock
from tests.conftest import base_env, cli, cli_here
from tests.fakes.ollama_server import FakeOllama
from tests.system.test_attachments import PNG, markers, vision_ollama

__all__ = ["vision_ollama"]  # a fixture, used by name


def sent(fake: FakeOllama) -> list[list[dict[str, Any]]]:
    """Each /api/chat request's messages, the system prompt left out."""
    return [[m for m in r["messages"] if m["role"] != "system"] for r in fake.chat_requests()]


def picture(tmp_path: Path) -> Path:
    path = tmp_path / "plan.png"
    path.write_bytes(PNG)
    return path


def test_a_failed_image_turn_is_withdrawn_and_the_conversation_goes_on(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    cid = cli_here(env, "new", "plans", "-m", "llama3.2").stdout.strip()
    conv = home.conv(cid)
    cli_here(env, "send", cid, "What does this plan show?", "--attach", str(picture(tmp_path)))
    cli(env, "run", "--once")
    assert fake_ollama.chat_requests() == []  # nothing sent to a model that cannot see
    [error] = [t for k, t in markers(conv) if k is MarkerKind.ERROR]
    assert f"withdraw it with `contemplation retract {cid}`" in error
    assert f"`contemplation set-model {cid} MODEL`" in error
    status = cli_here(env, "status", cid).stdout
    assert f"contemplation retract {cid}" in status and "set-model" in status
    assert "send a message to try again" not in status

    done = cli_here(env, "retract", cid)
    assert done.stdout.strip() == (
        f"withdrew the last turn of {cid} (block 1: What does this plan show?); "
        "the model will not see it"
    )
    assert markers(conv)[-1] == (MarkerKind.RETRACTED, "the agent withdrew this turn")
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE
    again = cli_here(env, "retract", cid, check=False)  # nothing failed any more
    assert again.returncode == 1
    assert again.stderr.startswith(f"error: {cid} has no failed or cancelled turn to withdraw")

    cli_here(env, "send", cid, "What is two and two?")
    cli(env, "run", "--once")
    [request] = sent(fake_ollama)
    assert [(m["role"], m["content"]) for m in request] == [("user", "What is two and two?")]
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE


def test_set_model_and_a_history_without_images_for_a_model_that_cannot_see(
    home: Home, vision_ollama: FakeOllama, tmp_path: Path
) -> None:
    """A picture answered by a vision model; the conversation moves to a model without
    vision: the old image is left out of its requests, and a NOTE says so once."""
    env = base_env(home, vision_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    cid = cli_here(env, "new", "plans", "-m", "llava").stdout.strip()
    conv = home.conv(cid)
    cli_here(env, "send", cid, "What does this plan show?", "--attach", str(picture(tmp_path)))
    cli(env, "run", "--once")
    assert "images" in sent(vision_ollama)[0][0]

    moved = cli_here(env, "set-model", cid, "llama3.2")
    assert moved.stdout.strip() == (
        f"{cid}: the next turn goes to llama3.2 on ollama (was llava on ollama)"
    )
    meta = read_metadata(conv)
    assert meta is not None and (meta.model, meta.backend) == ("llama3.2", "ollama")
    bad = cli_here(env, "set-model", cid, "llama3.2", "--backend", "nowhere", check=False)
    assert bad.returncode == 1 and "nowhere" in bad.stderr

    for n, question in enumerate(("Summarise it in words.", "And in one line?"), start=2):
        cli_here(env, "send", cid, question)
        cli(env, "run", "--once")
        request = sent(vision_ollama)[-1]
        assert len(sent(vision_ollama)) == n and request[-1]["content"] == question
        assert all("images" not in m for m in request), request
        assert vision_ollama.chat_requests()[-1]["model"] == "llama3.2"
    notes = [t for k, t in markers(conv) if k is MarkerKind.NOTE and "cannot see" in t]
    assert notes == [
        "llama3.2 cannot see images: plan.png left out of what it is sent "
        "(kept in the log and attachments/; a vision model sees them again)"
    ]
    assert [t for k, t in markers(conv) if k is MarkerKind.ERROR] == []


def test_mcp_respond_withdraws_the_failed_turn_and_changes_the_model(
    home: Home, vision_ollama: FakeOllama, tmp_path: Path
) -> None:
    env = base_env(home, vision_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    cid = cli_here(env, "new", "plans", "-m", "llama3.2").stdout.strip()
    conv = home.conv(cid)
    image = picture(tmp_path)
    cli_here(env, "send", cid, "What does this plan show?", "--attach", str(image))
    cli(env, "run", "--once")
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR
    settings = settings_mod.load(
        home=home.root,
        env={"OLLAMA_HOST": vision_ollama.url},
        overrides={"tools": {"allowed_roots": [str(tmp_path)]}},
        config=None,
    )

    async def script() -> tuple[dict[str, Any], str, str]:
        async with Client(mcp_server.build_server(settings)) as c:
            alive = DaemonLock(home)  # as a running daemon holds it: the hint is the error's
            alive.acquire()
            try:
                check = await c.call_tool("conversation_check", {"conversation_id": cid})
            finally:
                alive.release()
            hint = json.loads(getattr(check.content[0], "text", ""))["hint"]
            args = {
                "conversation_id": cid,
                "response": "What does this plan show?",
                "attachments": [str(image)],
                "retract": True,
                "model": "llava",
            }
            made = await c.call_tool("conversation_respond", args)
            assert not made.is_error, made.content
            again = await c.call_tool(
                "conversation_respond",
                {"conversation_id": cid, "response": "x", "retract": True},
            )
            assert again.is_error
            return (
                json.loads(getattr(made.content[0], "text", "")),
                hint,
                getattr(again.content[0], "text", ""),
            )

    out, hint, refused = asyncio.run(script())
    assert "retract" in hint and "model" in hint
    assert out["retracted"] is True and out["model"] == "llava"
    assert "no failed or cancelled turn to withdraw" in refused
    cli(env, "run", "--once")
    [request] = sent(vision_ollama)  # the withdrawn turn is not in it: one message
    assert len(request) == 1 and request[0]["content"].startswith("What does this plan show?")
    assert "images" in request[0] and vision_ollama.chat_requests()[0]["model"] == "llava"
