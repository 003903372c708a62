"""Agent results that stay small: check/wait cut a long reply or many blocks
at a budget and hand back a cursor that continues exactly at the cut; conversation_list pages
with an opaque cursor over data that changes between calls; an agent can list the models and
cancel a generation. Real folders written by the real writer; the real SDK client in process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from mcp import Client

from contemplation.faces.mcp import calls as mcp_faces
from contemplation.faces.reading import own_block
from contemplation.protocol import paging
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests.fakes.ollama_server import FakeOllama
from tests.system.test_mcp_server import run_calls, settings_for, tool, tool_error


def _conv(home: Home, topic: str = "pages") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="m", backend="ollama"
    )


def _read_all(faces: mcp_faces.Faces, conv: Conv, budget: int) -> tuple[list[Any], int]:
    """Follow the cursors from 0 until nothing is cut; the texts and how many calls it took."""
    cursor, calls, got = 0, 0, []
    pieces: dict[int, str] = {}
    while True:
        out = faces.check(conv.id, cursor, max_bytes=budget)
        calls += 1
        assert paging.size(out["blocks"]) <= budget
        for b in out["blocks"]:
            pieces[b["offset"]] = pieces.get(b["offset"], "") + b["text"]
            got.append(b["offset"])
        assert out["cursor"] > cursor or "cut" not in out  # always forward
        cursor = out["cursor"]
        if "cut" not in out:
            return [pieces[o] for o in dict.fromkeys(got)], calls
        assert calls < 10_000


def test_a_one_megabyte_reply_is_read_in_pages_once_and_whole(home: Home) -> None:
    conv = _conv(home)
    lines = [f"line {i:06d} " + "é" * 40 + " ===x" * (i % 3) for i in range(12_000)]
    text = "\n".join(lines)
    assert len(text.encode()) > 1_000_000
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "write a lot", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content(text)
        r.finish()
        w.append_block(
            "CLAUDE", "OLLAMA", "RESPONSE TO NEED: x\n(source: memory.search, t)\nA", msg_id="m2"
        )
    faces = mcp_faces.Faces(settings_for(home))
    texts, calls = _read_all(faces, conv, paging.PAGE_BYTES)
    whole = [b.text for b in parse(conv.log.read_bytes()).blocks if not own_block(b)]
    assert texts == whole  # every block, the long one whole, nothing twice
    assert calls >= len(text.encode()) // paging.PAGE_BYTES
    first = faces.check(conv.id, 0)
    assert first["cut"]["left_bytes"] > 0 and first["blocks"][0]["cut"] is True
    assert first["blocks"][0]["text"].endswith("\n")  # cut at a line boundary


def test_two_thousand_small_blocks_page_at_block_boundaries(home: Home) -> None:
    conv = _conv(home)
    with open_writer(conv, durable=False) as w:  # paging is tested, not 4,000 fsyncs
        for i in range(1000):
            w.append_block("CLAUDE", "OLLAMA", f"question {i}", msg_id=f"q{i}")
            r = w.reply("OLLAMA", "CLAUDE", f"r{i}")
            r.content(f"answer {i}")
            r.finish()
    faces = mcp_faces.Faces(settings_for(home))
    texts, calls = _read_all(faces, conv, 4_000)
    assert texts == [f"answer {i}" for i in range(1000)]
    assert 10 < calls < 200


def test_a_page_is_exact_across_appends_between_calls(home: Home) -> None:
    conv = _conv(home)
    faces = mcp_faces.Faces(settings_for(home))
    pieces: dict[int, str] = {}
    cursor = 0
    for round_ in range(5):
        with open_writer(conv) as w:
            r = w.reply("OLLAMA", "CLAUDE", f"r{round_}")
            r.content("\n".join(f"{round_}:{i}" for i in range(600)))
            r.finish()
        while True:
            out = faces.check(conv.id, cursor, max_bytes=2_000)
            for b in out["blocks"]:
                pieces[b["offset"]] = pieces.get(b["offset"], "") + b["text"]
            cursor = out["cursor"]
            if "cut" not in out:
                break
    lines = [ln for text in pieces.values() for ln in text.split("\n")]
    assert lines == [f"{r}:{i}" for r in range(5) for i in range(600)]


def test_list_pages_with_a_cursor_over_changing_data(home: Home) -> None:
    convs = [_conv(home, f"topic {i}") for i in range(45)]
    settings = settings_for(home)

    async def script(c: Client) -> list[dict[str, Any]]:
        first = await tool(c, "conversation_list", limit=20)
        _conv(home, "a newcomer")  # newer than all: not on a later page, not repeated
        second = await tool(c, "conversation_list", limit=20, cursor=first["cursor"])
        third = await tool(c, "conversation_list", limit=20, cursor=second["cursor"])
        bad = await tool_error(c, "conversation_list", cursor="nope")
        query = await tool(c, "conversation_list", query="topic 4", limit=200)
        return [first, second, third, {"bad": bad}, query]

    first, second, third, bad, query = run_calls(settings, script)
    assert first["total"] == 45 and first["count"] == 20 and first["more"] is True
    ids = [r["id"] for p in (first, second, third) for r in p["conversations"]]
    assert sorted(ids) == sorted(c.id for c in convs) and len(set(ids)) == 45
    assert third["more"] is False and "cursor" not in third
    assert set(first["conversations"][0]) <= {"id", "topic", "status", "model", "last_activity"}
    assert "not a cursor this server gave" in bad["bad"]
    # every word is in the topic (case aside)
    assert {r["topic"] for r in query["conversations"]} == {
        f"topic {i}" for i in range(45) if "4" in str(i)
    }
    assert len(json.dumps(first).encode()) < 5_000


def test_cancel_and_models_tools(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Any]
) -> None:
    conv = _conv(home)
    settings = make_settings(fake_ollama)

    async def script(c: Client) -> list[Any]:
        nothing = await tool_error(c, "conversation_cancel", conversation_id=conv.id)
        models = await tool(c, "conversation_models")
        tools = {t.name: t for t in (await c.list_tools()).tools}
        return [nothing, models, tools]

    nothing, models, tools = run_calls(settings, script)
    assert "nothing to cancel" in nothing
    assert models["default_backend"] == "ollama"
    [ollama] = [b for b in models["backends"] if b["backend"] == "ollama"]
    assert ollama["models"]  # what the fake server lists
    assert "default" in {t["name"] for t in models["templates"]}
    for t in tools.values():  # every parameter says what it is
        for name, prop in t.input_schema["properties"].items():
            assert prop.get("description"), (t.name, name)


@pytest.mark.parametrize("budget", [1, 10**9])
def test_the_budget_is_clamped(home: Home, budget: int) -> None:
    conv = _conv(home)
    with open_writer(conv) as w:
        r = w.reply("OLLAMA", "CLAUDE", "r")
        r.content("x" * 200_000)
        r.finish()
    out = mcp_faces.Faces(settings_for(home)).check(conv.id, 0, max_bytes=budget)
    shown = len(out["blocks"][0]["text"])
    assert paging.PAGE_FLOOR // 2 <= shown <= paging.PAGE_CAP


def test_list_json_pages_with_limit_and_cursor(home: Home) -> None:
    from tests.conftest import base_env, cli_here

    made = {_conv(home, f"t{i}").id for i in range(5)}
    env = base_env(home)
    seen: list[str] = []
    args = ["list", "--json", "--limit", "2"]
    for _ in range(5):
        page = json.loads(cli_here(env, *args).stdout)
        assert page["total"] == 5 and len(page["conversations"]) <= 2
        seen += [r["id"] for r in page["conversations"]]
        if not page["more"]:
            assert "cursor" not in page
            break
        args = ["list", "--json", "--limit", "2", "--cursor", page["cursor"]]
    assert sorted(seen) == sorted(made) and len(seen) == 5
    human = cli_here(env, "list", "--limit", "2")
    assert "more: contemplation list --limit 2 --cursor " in human.stderr
    assert len(human.stdout.strip().splitlines()) == 3  # the header and two rows


def test_list_json_is_the_shape_of_mcp_conversation_list(home: Home) -> None:
    """``list --json`` was an array (an object only with --limit) while MCP's
    conversation_list is an object: one shape, the items, the counts and a cursor."""
    from tests.conftest import base_env, cli_here

    made = {_conv(home, f"t{i}").id for i in range(3)}
    mcp = mcp_faces.Faces(settings_for(home)).list(limit=2)
    whole = json.loads(cli_here(base_env(home), "list", "--json").stdout)
    first = json.loads(cli_here(base_env(home), "list", "--json", "--limit", "2").stdout)
    assert set(first) == set(mcp) == {"conversations", "count", "total", "more", "cursor"}
    assert set(whole) == {"conversations", "count", "total", "more"}  # no cursor: no more
    assert (whole["count"], whole["total"], whole["more"]) == (3, 3, False)
    assert {r["id"] for r in whole["conversations"]} == made
