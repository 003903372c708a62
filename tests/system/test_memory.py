"""The durable memory/state store under the home, and the needs it answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contemplation import settings as settings_mod
from contemplation.errors import InputRejected, ToolError
from contemplation.needs.router import NeedRouter
from contemplation.needs.tools.memory import (
    MEMORY_FILE,
    STATE_FILE,
    JsonStore,
    MemorySearch,
    StoreError,
)
from contemplation.needs.tools.state import StateLookup
from contemplation.store.layout import Home


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


# --------------------------------------------------------------------------- the file format


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "not JSON"),
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not UTF-8 text"),
        (b"[]", 'must be a JSON object {"version", "entries"}, not list'),
        (b'{"version": 1}', '"entries" must be an object (key → entry), not nothing'),
        (b'{"version": 1, "entries": []}', '"entries" must be an object (key → entry), not list'),
        (b'{"version": 2, "entries": {}}', "format version 2; this contemplation reads 1"),
        (b'{"version": 1, "entries": {}, "extra": 1}', "unknown key 'extra'"),
        (b'{"entries": {"a": 3}}', "entry 'a' must be an object or a string, not int"),
        (b'{"entries": {"a": {"text": "x"}}}', "entry 'a' has an unknown field 'text'"),
        (b'{"entries": {"a": {"updated": "x"}}}', "entry 'a' needs a string 'value'"),
        (b'{"entries": {"a": {"value": "x", "tags": "t"}}}', "'tags' must be a list of strings"),
        (b'{"entries": {" ": "x"}}', "an entry has an empty key"),
        (
            b'{"entries": {"Deploy": "a", "deploy ": "b"}}',
            "keys 'Deploy' and 'deploy ' are the same key (case and spacing are ignored)",
        ),
    ],
)
def test_a_malformed_store_is_an_error_naming_the_file_and_never_empty(
    store: JsonStore, content: bytes, problem: str
) -> None:
    store.home.root.mkdir(parents=True)
    store.path.write_bytes(content)
    with pytest.raises(StoreError) as err:
        store.load()
    assert str(err.value).startswith(f"cannot read {store.path}: ")
    assert problem in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(StoreError):
        MemorySearch(store).answer("anything")  # never "nothing in memory (0 entries)"
    with pytest.raises(StoreError):
        store.put("new", "value")  # and nothing is written over it
    with pytest.raises(StoreError):
        store.delete("a")
    assert store.path.read_bytes() == content


def test_a_hand_written_file_without_version_or_optional_fields_is_read(store: JsonStore) -> None:
    store.home.root.mkdir(parents=True)
    store.path.write_text('{"entries": {"a": {"value": "1"}, "b": "2"}}')
    assert [(e.key, e.value, e.updated, e.tags) for e in store.entries()] == [
        ("a", "1", "", ()),
        ("b", "2", "", ()),
    ]
    store.put("c", "3")
    doc = json.loads(store.path.read_text())
    assert doc["version"] == 1 and set(doc["entries"]) == {"a", "b", "c"}  # nothing lost


def test_bad_input_is_refused_and_a_full_store_keeps_every_entry(tmp_path: Path) -> None:
    store = JsonStore(Home(tmp_path / "home"), MEMORY_FILE, durable=False, max_entries=2)
    store.put("a", "1")
    store.put("b", "2")
    with pytest.raises(InputRejected, match="holds 2 entries, the limit; remove some first"):
        store.put("c", "3")
    entry, before = store.add("A", "one")  # replacing is fine when full
    assert before is not None and before.value == "1" and entry.key == "A"
    with pytest.raises(InputRejected, match="an entry needs a key"):
        store.put("  ", "x")
    with pytest.raises(InputRejected, match="the value for 'b' is empty"):
        store.put("b", " \n")
    with pytest.raises(InputRejected, match="the value is 20,001 characters; at most 20,000"):
        store.put("b", "x" * 20_001)
    with pytest.raises(InputRejected, match="the key is 201 characters; at most 200"):
        store.put("k" * 201, "x")
    assert {e.key: e.value for e in store.entries()} == {"A": "one", "b": "2"}


CHILD = """
import sys
from pathlib import Path
from contemplation.store.layout import Home
from contemplation.needs.tools.memory import JsonStore
home, filename, who, count = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
store = JsonStore(Home(home), filename, durable=False)
print("ready", flush=True)
sys.stdin.readline()  # everyone starts together
for i in range(count):
    store.put(f"{who}-{i}", f"value {i} from {who}")
print("done", flush=True)
"""


def test_concurrent_adds_from_several_processes_all_survive(tmp_path: Path) -> None:
    home = tmp_path / "home"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(home), MEMORY_FILE, f"p{n}", "40"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[2],
        )
        for n in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.close()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    entries = JsonStore(Home(home), MEMORY_FILE).load()
    assert len(entries) == 4 * 40
    assert entries["p3-39"].value == "value 39 from p3"
    assert not list(home.glob(".memory.json.tmp.*"))  # every temp file was renamed in
