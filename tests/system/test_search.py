"""Full-text search over every conversation (with its derived index): ranked
hits with the block and a marked snippet, on the CLI and over MCP; hand-made and hand-edited
folders found without a restart; a corrupt, truncated or other-version index made anew; FTS5
syntax passed through, a query it rejects tried as a phrase. Real folders, real SQLite."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from mcp import Client

from contemplation.errors import InputRejected
from contemplation.faces.mcp import server as mcp_server
from contemplation.index import db as index_db
from contemplation.index import search as search_index
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import archive, new_conversation, open_writer
from tests.conftest import base_env, cli_here
from tests.system.test_mcp_server import settings_for, tool

LOG = """=== CLAUDE -> OLLAMA [2025-03-0{d} 10:00:00] ===
{question}

=== OLLAMA -> CLAUDE [2025-03-0{d} 10:00:05] ===
{answer}
"""


def _made(home: Home, topic: str, question: str, answer: str) -> Conv:
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="m", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", question, msg_id="q")
        r = w.reply("OLLAMA", "CLAUDE", "r")
        r.thinking("pondering the zeppelin")
        r.content(answer)
        r.finish()
    return conv


def _by_hand(home: Home, name: str, question: str, answer: str, day: int = 1) -> Path:
    d = home.active / name
    (d / "inbox").mkdir(parents=True)
    (d / "messages.log").write_text(LOG.format(d=day, question=question, answer=answer))
    return d


def test_ranked_hits_with_block_and_snippet_on_cli_and_mcp(home: Home) -> None:
    a = _made(home, "Animals", "Where do quokkas live?", "On Rottnest Island, mostly.")
    _made(
        home,
        "Islands",
        "Name an island",
        "Rottnest: the home of the quokka.\nAlso Kangaroo Island.",
    )
    _made(home, "Arithmetic", "What is 2+2?", "4")
    hand = _by_hand(home, "imported-notes", "Did the quokka come up?", "Yes, twice.")
    hits = search_index.search(home, "quokka*")  # a prefix: quokkas too
    assert {h.topic for h in hits} == {"Animals", "Islands", "imported-notes"} and hand.name in {
        h.conv for h in hits
    }
    assert len(hits) == 3 and all("«quokka" in h.snippet.lower() for h in hits)
    first = next(h for h in hits if h.conv == a.id)
    assert (first.block, first.sender) == (1, "CLAUDE")
    # the thinking is left out unless asked for
    assert search_index.search(home, "zeppelin") == []
    assert len(search_index.search(home, "zeppelin", search_index.Filters(thinking=True))) == 3
    env = base_env(home)
    lines = cli_here(env, "search", "rottnest", "--json").stdout.strip().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["snippet"].count("«") == 1
    human = cli_here(env, "search", '"Kangaroo Island"').stdout
    assert "#2 OLLAMA" in human and "«Kangaroo Island»" in human

    async def over_mcp() -> dict[str, object]:
        async with Client(mcp_server.build_server(settings_for(home))) as c:
            return await tool(c, "conversation_search", query="quokka", limit=2)

    got = asyncio.run(over_mcp())
    assert got["count"] == 2


def test_hand_edits_archives_and_removals_are_found_without_a_restart(home: Home) -> None:
    d = _by_hand(home, "by-hand", "first words", "plain answer")
    assert search_index.search(home, "walrus") == []
    with (d / "messages.log").open("a") as f:
        f.write("\n=== CLAUDE -> OLLAMA [2025-03-02 11:00:00] ===\nwhat about the walrus?\n")
    [hit] = search_index.search(home, "walrus")
    assert (hit.conv, hit.block) == ("by-hand", 3)
    conv = _made(home, "Gone soon", "the narwhal question", "narwhal answer")
    archive(home, conv)
    assert search_index.search(home, "narwhal") == []  # archived: only with include_archived
    assert {
        h.archived
        for h in search_index.search(home, "narwhal", search_index.Filters(archived=True))
    } == {True}
    import shutil

    shutil.rmtree(d)
    assert search_index.search(home, "walrus") == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "newer"])
def test_a_damaged_index_is_made_anew(home: Home, damage: str) -> None:
    _by_hand(home, "kept", "the octopus question", "eight arms")
    assert len(search_index.search(home, "octopus")) == 1
    path = index_db.db_path(home)
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        with sqlite3.connect(path) as c:
            c.execute("PRAGMA user_version=99")
    for p in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        if damage != "newer" and p.exists():
            p.unlink()
    assert len(search_index.search(home, "octopus")) == 1  # the folders are the truth


def test_query_syntax_passes_through_and_a_bad_one_is_a_phrase(home: Home) -> None:
    _by_hand(home, "q", 'he said "hello there" and AND more', "answer")
    assert len(search_index.search(home, "NEAR(hello there, 1)")) == 1
    assert search_index.search(home, "hello NOT there") == []
    assert len(search_index.search(home, '"hello there')) == 1  # unbalanced: as a phrase
    assert len(search_index.search(home, "AND")) == 1
    with pytest.raises(InputRejected, match="needs a query"):
        search_index.search(home, "   ")


def test_reindex_and_check_say_and_mend_what_the_index_lacks(home: Home) -> None:
    env = base_env(home)
    _by_hand(home, "one", "the albatross question", "an answer")
    assert len(search_index.search(home, "albatross")) == 1
    _by_hand(home, "two", "another albatross", "more")
    check = cli_here(env, "reindex", "--check", "--json", check=False)
    assert check.returncode == 1 and json.loads(check.stdout) == {
        "missing": ["two"],
        "gone": [],
        "changed": [],
    }
    done = cli_here(env, "reindex")
    assert done.stdout.strip() == f"indexed 2 conversation(s) into {index_db.db_path(home)}"
    again = cli_here(env, "reindex", "--check")
    assert again.returncode == 0 and again.stdout.splitlines()[0] == "missing: 0"
    assert len(search_index.search(home, "albatross")) == 2


def test_words_past_the_bound_of_a_block_are_not_found_and_a_search_says_so(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block longer than the reader's bound (logstream.MAX_BLOCK_BYTES, 16 MiB;
    64 KiB here) is indexed by its first bytes. The index records which blocks were cut, a hit
    in one says how much of it was indexed, and every search over them says that words past
    the bound are not found (the honest, bounded choice: nothing reads a block whole)."""
    from contemplation.store import logstream

    monkeypatch.setattr(logstream, "MAX_BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(logstream, "CHUNK", 16 << 10)  # read as a big log is: a chunk at a time
    filler = ("lorem ipsum dolor sit amet " * 40 + "\n") * 200  # ~216 KB
    _by_hand(home, "big", "short question", f"aardvark begins\n{filler}zanzibar ends")
    _by_hand(home, "small", "another", "nothing long here", day=2)
    late = search_index.find(home, "zanzibar")
    assert late.hits == [] and late.partial == 1
    said = late.as_dict()["partly_indexed"]
    assert said.startswith("1 block(s) searched are longer than the index's bound of 65,536 bytes")
    early = search_index.find(home, "aardvark")
    [hit] = early.hits
    out = hit.as_dict()
    assert out["block_bytes"] > out["indexed_bytes"] >= 60 << 10
    assert "indexed_bytes" not in search_index.find(home, "another").hits[0].as_dict()

    async def over_mcp() -> dict[str, object]:
        async with Client(mcp_server.build_server(settings_for(home))) as c:
            return await tool(c, "conversation_search", query="zanzibar")

    got = asyncio.run(over_mcp())
    assert got["count"] == 0 and got["partly_indexed"] == said
