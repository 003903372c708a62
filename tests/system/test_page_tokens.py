"""``max_bytes`` up to 64,000 could exceed Claude Code's 25,000-token cut of a tool
result for CJK or emoji text (a CJK character is three bytes and one to two tokens, an emoji
four bytes and two). A page is budgeted in estimated tokens as well as bytes, with the
same cursor: a cut page says so and the next call continues exactly at the cut."""

from __future__ import annotations

import json
from typing import Any

from mcp import Client

from contemplation.faces.reading import own_block
from contemplation.protocol import paging
from contemplation.protocol.parser import parse
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests.system.test_mcp_server import run_calls, settings_for, tool

CLAUDE_CODE_CUT = 25_000  # tokens: Claude Code's cut of an MCP tool result


def claude_tokens(text: str) -> int:
    """An estimate independent of paging's, no kinder than a real tokenizer: an ASCII
    character a quarter token (three characters a token where they are JSON punctuation), any
    other character one token, an emoji (astral plane, four bytes) two."""
    ascii_n = sum(1 for ch in text if ord(ch) < 0x80)
    punct = sum(1 for ch in text if ch in '{}[]":,\\')
    astral = sum(1 for ch in text if ord(ch) > 0xFFFF)
    return ascii_n // 4 + punct // 3 + (len(text) - ascii_n - astral) + 2 * astral


def test_cjk_and_emoji_pages_stay_under_claude_codes_cut_and_walk_the_whole_log(
    home: Home,
) -> None:
    conv = new_conversation(
        home, "漢字", template=load_template(home, "default"), model="m", backend="ollama"
    )
    cjk = "\n".join("東京の天気は晴れです。" * 8 + f" {i}" for i in range(600))
    emoji = "".join("🙂🚀🌸👍🏽" for _ in range(5_000))  # no newline: cut inside a line
    with open_writer(conv) as w:
        for i in range(6):
            w.append_block("CLAUDE", "OLLAMA", f"ask {i}", msg_id=f"m{i}")
            r = w.reply("OLLAMA", "CLAUDE", f"r{i}")
            r.content(cjk if i % 2 else emoji)
            r.finish()
    whole = [b.text for b in parse(conv.log.read_bytes()).blocks if not own_block(b)]
    assert sum(claude_tokens(t) for t in whole) > 4 * CLAUDE_CODE_CUT

    async def script(c: Client) -> list[dict[str, Any]]:
        pages, cursor = [], 0
        for _ in range(200):  # bounded: about twenty pages are expected
            out = await tool(
                c, "conversation_check", conversation_id=conv.id, cursor=cursor, max_bytes=64_000
            )
            pages.append(out)
            assert out["cursor"] > cursor or "cut" not in out  # always forward
            cursor = out["cursor"]
            if "cut" not in out:
                return pages
        raise AssertionError("the cursor never reached the end")

    pages = run_calls(settings_for(home), script)
    pieces: dict[int, str] = {}
    for out in pages:
        text = json.dumps(out, ensure_ascii=False, separators=(",", ":"))
        assert claude_tokens(text) < CLAUDE_CODE_CUT, claude_tokens(text)
        assert paging.tokens(out["blocks"]) <= paging.PAGE_TOKENS
        assert paging.size(out["blocks"]) <= 64_000
        for b in out["blocks"]:
            assert b.get("continues", 0) == len(pieces.get(b["offset"], "").encode())
            pieces[b["offset"]] = pieces.get(b["offset"], "") + b["text"]
    assert list(pieces.values()) == whole  # nothing lost, nothing twice, no character split
    cut = next(p["cut"] for p in pages if "cut" in p)
    assert cut["budget_tokens"] == paging.PAGE_TOKENS and "call again" in cut["next"]
