"""Tool arguments of ``contemplation mcp`` are checked: an unknown one is refused with the name
to use, a paging input is ``cursor`` on every tool (``since`` still accepted on check, wait and
respond), and a refused value is one line with no library URL in it. The real SDK client
against the real server in process; over stdio, a process of its own, in
tests/system/test_mcp_arguments_stdio.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from mcp import Client

from contemplation import settings as settings_mod
from contemplation.faces.mcp import server as mcp_server
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def two_exchanges(home: Home) -> tuple[Conv, int]:
    """A conversation of two exchanges, and the cursor between them."""
    conv = new_conversation(
        home, "args", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "Plan the migration.", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content("Step one.")
        r.finish()
    middle = conv.log.stat().st_size
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "And then?", msg_id="m2")
        r = w.reply("OLLAMA", "CLAUDE", "r2")
        r.content("Step two.")
        r.finish()
    return conv, middle


async def result(c: Client, name: str, args: dict[str, Any]) -> tuple[bool, str]:
    got = await c.call_tool(name, args)
    return bool(got.is_error), "".join(getattr(b, "text", "") for b in got.content)


async def ok(c: Client, name: str, **args: Any) -> dict[str, Any]:
    error, text = await result(c, name, args)
    assert not error, text
    out: dict[str, Any] = json.loads(text)
    return out


async def refused(c: Client, name: str, **args: Any) -> str:
    error, text = await result(c, name, args)
    assert error, text
    assert "\n" not in text and "http" not in text and "pydantic" not in text, text
    return text


def in_process(home: Home, script: Any) -> Any:
    async def main() -> Any:
        settings = settings_mod.load(home=home.root, env={}, config=None)
        async with Client(mcp_server.build_server(settings)) as c:
            return await script(c)

    return asyncio.run(main())


def test_every_tool_refuses_an_unknown_argument_and_names_the_right_one(home: Home) -> None:
    conv, _ = two_exchanges(home)

    async def script(c: Client) -> tuple[dict[str, str], list[str]]:
        tools = (await c.list_tools()).tools
        bogus = {t.name: await refused(c, t.name, bogus=1) for t in tools}
        named = [
            await refused(c, "conversation_list", curser="x"),
            await refused(c, "conversation_check", conversation_id=conv.id, max_byte=2000),
            await refused(c, "conversation_search", query="plan", page=3),
            await refused(c, "conversation_wait", conversation_id=conv.id, timeout=1, x=2),
        ]
        return bogus, named

    bogus, (curser, max_byte, search, two) = in_process(home, script)
    assert len(bogus) == 14  # conversation_related is the 14th
    for text in bogus.values():
        assert text.startswith("unknown argument 'bogus': this tool takes "), text
    assert bogus["conversation_check"].endswith("conversation_id, cursor, include_own, max_bytes")
    assert bogus["conversation_models"].endswith("this tool takes no arguments")
    assert curser == "unknown argument 'curser': this tool's is 'cursor'"
    assert max_byte == "unknown argument 'max_byte': this tool's is 'max_bytes'"
    assert search.startswith("unknown argument 'page': this tool takes ")
    assert "query" in search and "since" in search
    assert two.startswith("unknown arguments 'timeout' (this tool's is 'timeout_s'), 'x'")


def test_paging_is_cursor_everywhere_and_since_an_alias(home: Home) -> None:
    conv, mid = two_exchanges(home)

    async def script(c: Client) -> dict[str, Any]:
        args = {"conversation_id": conv.id, "include_own": True}
        return {
            "schemas": {t.name: t.input_schema for t in (await c.list_tools()).tools},
            "cursor": await ok(c, "conversation_check", **args, cursor=mid),
            "since": await ok(c, "conversation_check", **args, since=mid),
            "both": await ok(c, "conversation_check", **args, cursor=mid, since=mid),
            "differ": await refused(c, "conversation_check", **args, cursor=mid, since=0),
            "waited": await ok(c, "conversation_wait", **args, cursor=mid, timeout_s=0),
            "waited_since": await ok(c, "conversation_wait", **args, since=mid, timeout_s=0),
            "wait_differ": await refused(c, "conversation_wait", **args, cursor=1, since=2),
            "respond": await ok(
                c, "conversation_respond", conversation_id=conv.id, response="Go on.", cursor=7
            ),
            "respond_since": await ok(
                c, "conversation_respond", conversation_id=conv.id, response="More.", since=9
            ),
            "negative": await refused(c, "conversation_check", conversation_id=conv.id, cursor=-1),
            "negative_since": await refused(
                c, "conversation_check", conversation_id=conv.id, since=-1
            ),
        }

    out = in_process(home, script)
    for name in ("conversation_check", "conversation_wait", "conversation_respond"):
        props = out["schemas"][name]["properties"]
        assert "cursor" in props and "since" not in props, name
        assert "since" not in json.dumps(out["schemas"][name]), name
    assert "cursor" in out["schemas"]["conversation_list"]["properties"]
    texts = [b["text"] for b in out["cursor"]["blocks"]]
    assert texts == ["And then?", "Step two."]
    for key in ("since", "both"):
        assert out[key]["blocks"] == out["cursor"]["blocks"]
        assert out[key]["cursor"] == out["cursor"]["cursor"]
    assert out["waited"]["blocks"] == out["waited_since"]["blocks"] == out["cursor"]["blocks"]
    assert out["differ"] == (
        f"'cursor' and 'since' are the same argument: give one (got {mid} and 0)"
    )
    assert "'cursor' and 'since' are the same argument" in out["wait_differ"]
    assert out["respond"]["cursor"] == 7 and out["respond_since"]["cursor"] == 9
    assert out["negative"] == "argument 'cursor': Input should be greater than or equal to 0"
    assert out["negative_since"] == "argument 'since': Input should be greater than or equal to 0"


def test_refused_values_are_one_line_without_library_urls(home: Home) -> None:
    conv, _ = two_exchanges(home)

    async def script(c: Client) -> list[str]:
        return [
            await refused(c, "conversation_check"),
            await refused(c, "conversation_check", conversation_id=conv.id, max_bytes="lots"),
            await refused(c, "conversation_list", limit=0, status=3),
            await refused(c, "conversation_approve", conversation_id=conv.id, decision="maybe"),
        ]

    missing, lots, two, decision = in_process(home, script)
    assert missing == "missing argument 'conversation_id'"
    assert lots.startswith("argument 'max_bytes': Input should be a valid integer")
    assert two == (
        "argument 'status': Input should be a valid string; "
        "argument 'limit': Input should be greater than or equal to 1"
    )
    assert decision.startswith("argument 'decision': Input should be 'once', 'always'")
