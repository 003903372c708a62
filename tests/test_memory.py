"""The durable memory/state store under the home, and the needs it answers."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from contemplation import settings as settings_mod
from contemplation.errors import ToolError
from contemplation.layout import Home
from contemplation.needs.router import MEMORY_FILE, STATE_FILE, NeedRouter
from contemplation.tools.memory import JsonStore, MemorySearch
from contemplation.tools.state import StateLookup


@pytest.fixture
def store(tmp_path: Path) -> JsonStore:
    return JsonStore(Home(tmp_path / "home"), MEMORY_FILE, durable=False)


def test_put_get_and_the_file_is_plain_json_written_atomically(store: JsonStore) -> None:
    assert store.load() == {}
    store.put("Query Patterns", "mostly point lookups by id", tags=["db"])
    doc = json.loads(store.path.read_text())
    assert doc["version"] == 1
    assert doc["entries"]["Query Patterns"]["value"] == "mostly point lookups by id"
    assert doc["entries"]["Query Patterns"]["tags"] == ["db"]
    assert not list(store.path.parent.glob(".*.tmp.*"))  # no temp file left behind
    again = JsonStore(store.home, MEMORY_FILE)  # a new process sees it
    entry = again.get("  query   PATTERNS ")
    assert entry is not None and entry.value == "mostly point lookups by id"
    assert again.delete("query patterns")
    assert again.get("query patterns") is None
    assert not again.delete("query patterns")


def test_search_ranks_key_matches_first(store: JsonStore) -> None:
    store.put("redis cache", "TTL five minutes")
    store.put("deploy", "we deploy on fridays, the cache is warmed after")
    store.put("unrelated", "lunch menu")
    hits = store.search("cache")
    assert [e.key for _, e in hits] == ["redis cache", "deploy"]


def test_a_hand_edit_is_picked_up(store: JsonStore) -> None:
    store.put("a", "1")
    assert store.get("a") is not None
    doc = {"version": 1, "entries": {"b": {"value": "2"}, "c": "plain string value"}}
    store.path.write_text(json.dumps(doc))
    st = store.path.stat()
    os.utime(store.path, ns=(st.st_atime_ns, st.st_mtime_ns + 3_000_000_000))
    assert store.get("a") is None
    c = store.get("c")
    assert c is not None and c.value == "plain string value"


def test_a_corrupt_store_is_a_tool_error(store: JsonStore) -> None:
    store.home.root.mkdir(parents=True)
    store.path.write_text("{not json")
    with pytest.raises(ToolError, match="cannot read"):
        store.load()


def test_memory_and_state_answers(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    mem = JsonStore(home, MEMORY_FILE, durable=False)
    state = JsonStore(home, STATE_FILE, durable=False)
    mem.put("query performance", "p99 is 40 ms since the index on user_id")
    state.put("deploy pipeline", "green; last run 10:02")
    state.put("database", "migrating to v16")
    found = MemorySearch(mem).answer("query performance metrics")
    assert "p99 is 40 ms" in found.text and found.source == str(mem.path)
    assert "nothing in memory about 'zebra'" in MemorySearch(mem).answer("zebra").text
    lookup = StateLookup(state)
    assert lookup.answer("Deploy Pipeline").text.startswith("deploy pipeline (recorded ")
    close = lookup.answer("pipeline")
    assert "closest recorded" in close.text and "green" in close.text
    none = lookup.answer("kubernetes")
    assert none.text == "no state recorded for 'kubernetes'; recorded: database, deploy pipeline"


def test_needs_are_answered_from_the_store_through_the_router(tmp_path: Path) -> None:
    settings = settings_mod.load(home=tmp_path / "home", env={}, config=None)
    home = Home(settings.home)
    JsonStore(home, MEMORY_FILE).put("query patterns", "reads dominate 9:1")
    JsonStore(home, STATE_FILE).put("build", "failing since 09:00 (flaky test)")

    async def run() -> list[str]:
        async with NeedRouter(settings, now=lambda: "2026-01-19 10:01:00") as router:
            answered = await router.answer_all(
                ["Brain memory about query patterns", "Current state of build"],
                conv_id="c",
                turn_key="t",
            )
        return [a.render_block(n) for n, a in answered if a is not None]

    memory_block, state_block = asyncio.run(run())
    assert memory_block.splitlines()[:2] == [
        "RESPONSE TO NEED: Brain memory about query patterns",
        "(source: memory.search, 2026-01-19 10:01:00)",
    ]
    assert "reads dominate 9:1" in memory_block
    assert "failing since 09:00" in state_block
    assert str(home.root / STATE_FILE) in state_block


def test_a_broken_store_degrades_the_answer_and_says_why(tmp_path: Path) -> None:
    settings = settings_mod.load(home=tmp_path / "home", env={}, config=None)
    Path(settings.home).mkdir(parents=True)
    (Path(settings.home) / MEMORY_FILE).write_text("[[[")

    async def run() -> str:
        async with NeedRouter(settings) as router:
            [(need, answer)] = await router.answer_all(
                ["Brain memory about x"], conv_id="c", turn_key="t"
            )
        assert answer is not None and answer.status == "failed"
        return answer.render_block(need)

    block = asyncio.run(run())
    assert "NOT ANSWERED (failed): cannot read" in block
