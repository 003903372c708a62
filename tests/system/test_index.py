"""The derived index of every conversation: lists read from it (activity and turns
from the log's own dated blocks, pages with a keyset cursor), prune and retention, the daemon
keeping it current off the event loop, migrations, a locked or shared database, and two
processes refreshing it at once. Real folders, real SQLite, the real CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contemplation.daemon.index_keeper import IDLE_S, Keeper
from contemplation.daemon.root import build_runtime
from contemplation.engine.runtime import Runtime
from contemplation.errors import InputRejected
from contemplation.index import db as index_db
from contemplation.index import listing, retention
from contemplation.index import search as search_index
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.writer import archive
from tests.conftest import ROOT, base_env, cli_here, wait_for

EXCHANGE = """=== CLAUDE -> OLLAMA [{day} 10:00:00] ===
{question}

=== OLLAMA -> CLAUDE [{day} 10:00:05] ===
{answer}
"""


def by_hand(home: Home, name: str, day: str, word: str = "plain", rounds: int = 1) -> Path:
    """A folder made by hand (or restored from a backup): a log with dated exchanges, no
    metadata, no state."""
    d = home.active / name
    (d / "inbox").mkdir(parents=True)
    text = "".join(
        EXCHANGE.format(day=day, question=f"question {i} {word}", answer=f"answer {i}")
        for i in range(rounds)
    )
    (d / "messages.log").write_text(text)
    return d


def rows(home: Home, *args: str) -> list[dict[str, object]]:
    data = json.loads(cli_here(base_env(home), "list", "--json", *args).stdout)
    return list(data["conversations"])


def test_folders_made_by_hand_sort_by_when_their_logs_were_used(home: Home) -> None:
    """Copied in one after another (newest copy last), each shows the day its log says, the
    turns its log holds, and sorts by that; a conversation with nothing said yet is newest."""
    by_hand(home, "from-march", "2025-03-01", rounds=3)
    by_hand(home, "from-june", "2025-06-01")
    by_hand(home, "from-january", "2025-01-01", rounds=2)
    made = cli_here(base_env(home), "new", "fresh topic").stdout.strip()
    got = rows(home)
    assert [r["id"] for r in got] == [made, "from-june", "from-march", "from-january"]
    by_id = {r["id"]: r for r in got}
    assert by_id["from-march"]["last_activity"] == "2025-03-01 10:00:05"
    assert (by_id["from-march"]["turns"], by_id["from-march"]["messages"]) == (3, 3)
    assert by_id["from-january"]["blocks"] == 4 and by_id[made]["turns"] == 0
    human = cli_here(base_env(home), "list").stdout
    assert "2025-06-01 10:00:05" in human and human.index("from-june") < human.index("from-march")


def test_list_pages_miss_nothing_and_repeat_nothing_while_conversations_change(
    home: Home,
) -> None:
    for i in range(30):
        by_hand(home, f"conv-{i:02d}", f"2025-01-{i + 1:02d}")
    env = base_env(home)
    first = json.loads(cli_here(env, "list", "--limit", "12", "--json").stdout)
    assert first["total"] == 30 and len(first["conversations"]) == 12 and first["cursor"]
    by_hand(home, "newcomer", "2025-12-31")  # newer than every row: on no later page
    archive(home, listing_conv(home, first["conversations"][0]["id"]))  # already shown
    second = json.loads(
        cli_here(env, "list", "--limit", "12", "--cursor", first["cursor"], "--json").stdout
    )
    third = json.loads(
        cli_here(env, "list", "--limit", "12", "--cursor", second["cursor"], "--json").stdout
    )
    assert third["more"] is False and "cursor" not in third  # the shape of MCP's list
    seen = [r["id"] for p in (first, second, third) for r in p["conversations"]]
    assert sorted(seen) == [f"conv-{i:02d}" for i in range(30)] and len(set(seen)) == 30
    bad = cli_here(env, "list", "--limit", "5", "--cursor", "not-a-cursor", check=False)
    assert bad.returncode != 0 and "not a cursor" in bad.stderr and "Traceback" not in bad.stderr


def listing_conv(home: Home, conv_id: str):  # type: ignore[no-untyped-def]
    from contemplation.faces.reading import locate

    return locate(home, conv_id)


def test_status_counts_conversations_and_disk_use_from_the_index(home: Home) -> None:
    by_hand(home, "active-one", "2025-02-01", rounds=50)
    gone = by_hand(home, "archived-one", "2025-02-02", rounds=10)
    archive(home, listing_conv(home, gone.name))
    data = json.loads(cli_here(base_env(home), "status", "--json").stdout)
    assert (data["active"], data["completed"]) == (1, 1)
    assert data["disk_active"].endswith("KB") and data["disk_completed"].endswith("KB")
    counts = listing.counts(home)
    log_bytes = (home.active / "active-one" / "messages.log").stat().st_size
    assert counts["active_bytes"] >= log_bytes


# --------------------------------------------------------------------------- prune


@contextlib.asynccontextmanager
async def keeping(rt: Runtime) -> AsyncIterator[Keeper]:
    """The daemon's keeper running, seeing the runtime's events, stopped and closed after."""
    keeper = Keeper(rt)
    stop = asyncio.Event()
    with rt.observing(keeper.observe):
        task = asyncio.create_task(keeper.run(stop))
        try:
            yield keeper
        finally:
            stop.set()  # wakes its idle wait (IDLE_S, 30 s): it returns at once
            await asyncio.wait_for(task, 10)
            await rt.aclose()


def test_prune_dry_run_then_real_never_touches_active_ones(home: Home) -> None:
    for name, day in (("old-a", "2025-01-05"), ("old-b", "2025-02-05"), ("recent", "")):
        d = by_hand(home, name, day or time.strftime("%Y-%m-%d"), word=f"word{name[-1]}")
        archive(home, listing_conv(home, d.name))
    by_hand(home, "old-but-active", "2024-01-01", word="wordz")
    env = base_env(home)
    dry = json.loads(cli_here(env, "prune", "--older-than", "90d", "--dry-run", "--json").stdout)
    assert [r["id"] for r in dry["removed"]] == ["old-a", "old-b"] and dry["dry_run"] is True
    assert dry["freed_bytes"] > 0 and (home.completed / "old-a").is_dir()
    human = cli_here(env, "prune", "--older-than", "90d").stdout
    assert "removed old-a" in human and "removed 2 archived conversation(s)" in human
    assert not (home.completed / "old-a").exists() and not (home.completed / "old-b").exists()
    assert (home.completed / "recent").is_dir() and (home.active / "old-but-active").is_dir()
    # their index rows went with them: nothing found, nothing listed
    assert search_index.search(home, "worda", search_index.Filters(archived=True)) == []
    assert {r["id"] for r in rows(home, "--all")} == {"recent", "old-but-active"}
    bad = cli_here(env, "prune", "--older-than", "soon", check=False)
    assert bad.returncode != 0 and "not an age" in bad.stderr
    with pytest.raises(InputRejected):
        retention.parse_age("0d")
    assert retention.parse_age("2w") == 14 * 86400 and retention.parse_age("12h") == 43200


def test_the_daemon_prunes_once_a_day_when_retention_is_set(home: Home) -> None:
    old = by_hand(home, "very-old", "2024-05-01")
    archive(home, listing_conv(home, old.name))
    by_hand(home, "old-active", "2024-05-01")
    settings = Settings(home=home.root, retention={"archived_days": 30})  # type: ignore[arg-type]
    rt = build_runtime(settings)

    async def scenario() -> None:
        async with keeping(rt) as keeper:
            gone = lambda: not (home.completed / "very-old").exists()  # noqa: E731
            await asyncio.to_thread(wait_for, gone, 10, 0.02, "the daily prune")
            assert (home.active / "old-active").is_dir()
            pruned_at = keeper.last_prune
            await keeper.maybe_prune()
            assert keeper.last_prune == pruned_at  # not again within the day

    asyncio.run(scenario())


# --------------------------------------------------------------------------- the daemon


def _indexed(home: Home, conv_id: str) -> dict[str, object] | None:
    """The index's row as it stands, without bringing it up to date."""
    conn = sqlite3.connect(index_db.db_path(home))
    try:
        got = conn.execute("SELECT row FROM convs WHERE id = ?", (conv_id,)).fetchone()
    finally:
        conn.close()
    return json.loads(got[0]) if got else None


def test_the_daemon_keeps_the_index_current_from_its_events(home: Home) -> None:
    """An event only sets a flag on the loop; a worker thread brings the index up to date,
    many events in a burst being one refresh."""
    rt = build_runtime(Settings(home=home.root))

    async def scenario() -> None:
        async with keeping(rt) as keeper:
            await asyncio.to_thread(wait_for, lambda: keeper.refreshes >= 1, 10, 0.01, "first")
            by_hand(home, "arrived", "2025-04-04", word="capybara")
            before = keeper.refreshes
            t0 = time.perf_counter()
            for _ in range(100):
                rt.notify("arrived", "message")
            on_loop = (time.perf_counter() - t0) / 100
            await asyncio.to_thread(
                wait_for, lambda: _indexed(home, "arrived") is not None, 10, 0.01, "the row"
            )
            assert keeper.refreshes == before + 1  # one refresh for the burst
            assert on_loop < 0.005  # an Event.set, not a refresh, on the loop

    asyncio.run(scenario())
    row = _indexed(home, "arrived")
    assert row is not None and row["last_activity"] == "2025-04-04 10:00:05"


def _awaiting(task: asyncio.Task[None]) -> list[str]:
    """The coroutines a task waits in, outermost first."""
    names: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and hasattr(coro, "cr_code"):
        names.append(coro.cr_code.co_name)
        coro = coro.cr_await
    return names


def test_the_keeper_returns_when_told_to_stop_in_its_idle_wait(home: Home) -> None:
    """The daemon's stop wakes the keeper's idle wait: it returns at once, not when the
    wait (IDLE_S, 30 s) runs out."""
    rt = build_runtime(Settings(home=home.root))

    async def scenario() -> float:
        keeper = Keeper(rt)
        stop = asyncio.Event()
        task = asyncio.create_task(keeper.run(stop))
        try:
            for _ in range(1000):  # bounded: past the first refresh, into the idle wait
                if keeper.refreshes >= 1 and "_first_of" in _awaiting(task):
                    break
                await asyncio.sleep(0.01)
            assert "_first_of" in _awaiting(task), _awaiting(task)
            t0 = time.monotonic()
            stop.set()
            await asyncio.wait_for(task, IDLE_S / 3)
            return time.monotonic() - t0
        finally:
            task.cancel()
            await rt.aclose()

    took = asyncio.run(scenario())
    print(f"the keeper returned {took * 1000:.1f} ms after the stop")
    assert took < 2.0, took


# --------------------------------------------------------------------------- the database


OLD_SCHEMA_2 = (
    "CREATE TABLE convs (id TEXT PRIMARY KEY, archived INTEGER, topic TEXT, model TEXT, "
    "backend TEXT, status TEXT, last_ts REAL, blocks INTEGER, key TEXT)",
    "CREATE TABLE owned (conv TEXT, rid INTEGER)",
    "CREATE VIRTUAL TABLE text USING fts5(conv UNINDEXED, block UNINDEXED, sender UNINDEXED, "
    "time UNINDEXED, body, thinking)",
    "INSERT INTO convs VALUES ('ghost', 0, 't', 'm', 'b', 'idle', 1.0, 1, 'k')",
    "PRAGMA user_version=2",
)


@pytest.mark.parametrize("version", [2, 99])
def test_an_older_or_newer_schema_is_migrated_by_a_rebuild(home: Home, version: int) -> None:
    by_hand(home, "kept", "2025-05-05", word="pangolin")
    home.root.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(index_db.db_path(home))
    for sql in OLD_SCHEMA_2:
        conn.execute(sql.replace("user_version=2", f"user_version={version}"))
    conn.commit()
    conn.close()
    assert [r["id"] for r in listing.summaries(home)] == ["kept"]  # the ghost row is gone
    assert [h.conv for h in search_index.search(home, "pangolin")] == ["kept"]
    conn = sqlite3.connect(index_db.db_path(home))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == index_db.SCHEMA
    conn.close()


def test_a_locked_index_is_read_as_it_stands(home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    by_hand(home, "first", "2025-01-01")
    assert [r["id"] for r in listing.summaries(home)] == ["first"]
    by_hand(home, "second", "2025-01-02")
    holder = sqlite3.connect(index_db.db_path(home), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process mid-write
    monkeypatch.setattr(index_db, "BUSY_MS", 100)
    try:
        assert [r["id"] for r in listing.summaries(home)] == ["first"]  # no error, no wait
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r["id"] for r in listing.summaries(home)] == ["second", "first"]


def test_two_processes_bringing_the_index_up_to_date_at_once_index_each_block_once(
    home: Home,
) -> None:
    for i in range(300):
        by_hand(home, f"c{i:03d}", "2025-03-03", word=f"w{i}", rounds=2)
    env = base_env(home)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "contemplation", "search", "question", "--json"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert len(out.splitlines()) == 20
    with index_db.opened(home) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute("INSERT INTO text (text) VALUES ('integrity-check')")  # terms = blocks
        assert conn.execute("SELECT count(*) FROM blocks").fetchone()[0] == 300 * 4
        assert conn.execute("SELECT count(*) FROM convs").fetchone()[0] == 300


def test_tool_output_framing_is_not_indexed_but_what_it_framed_is(home: Home) -> None:
    d = by_hand(home, "framed", "2025-07-07")
    with (d / "messages.log").open("a") as f:
        f.write(
            "\n=== CLAUDE -> OLLAMA [2025-07-07 10:01:00] ===\n"
            "RESPONSE TO NEED: File contents of notes.md\n"
            "BEGIN TOOL OUTPUT (files.read)\nthe axolotl section\nEND TOOL OUTPUT\n"
        )
    assert [h.block for h in search_index.search(home, "axolotl")] == [3]
    assert search_index.search(home, '"TOOL OUTPUT"') == []
    assert [h.block for h in search_index.search(home, "notes")] == [3]


def test_archived_folders_are_looked_at_when_completed_changes_or_each_minute(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh stats the active folders every time and the archived ones when completed/
    itself changed (an archive, a reopen, a restore) or at least every FULL_SWEEP_S; a hand
    edit inside an archived folder is found by the next full sweep."""
    for i in range(3):
        d = by_hand(home, f"old-{i}", "2025-01-01", word="lemur")
        archive(home, listing_conv(home, d.name))
    every = search_index.Filters(archived=True)
    now = time.time()
    monkeypatch.setattr(index_db.time, "time", lambda: now)  # one sweep window, then the next
    assert len(search_index.search(home, "lemur", every)) == 3
    stats: list[str] = []
    real = index_db._stat_key
    monkeypatch.setattr(index_db, "_stat_key", lambda p: stats.append(p) or real(p))
    search_index.search(home, "lemur", every)
    assert not [p for p in stats if "/completed/" in p]  # nothing of completed/ changed
    with (home.completed / "old-1" / "messages.log").open("a") as f:
        f.write("\n=== CLAUDE -> OLLAMA [2025-01-02 10:00:00] ===\na tapir by hand\n")
    later = time.time() + index_db.FULL_SWEEP_S
    monkeypatch.setattr(index_db.time, "time", lambda: later)
    assert [h.conv for h in search_index.search(home, "tapir", every)] == ["old-1"]
    restored = home.completed / "restored"
    (restored / "inbox").mkdir(parents=True)
    (restored / "messages.log").write_text(
        EXCHANGE.format(day="2024-02-02", question="q okapi", answer="a")
    )
    assert [h.conv for h in search_index.search(home, "okapi", every)] == ["restored"]


def test_an_append_indexes_only_the_growing_tail(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply streamed into the log and a block after it: the index reads only from the last
    block it holds (which may have been growing), keeps each block once, and counts right. A
    log rewritten in place (the bytes where that block was are no header now) is read whole."""
    d = by_hand(home, "growing", "2025-08-08", word="first", rounds=2)
    assert len(search_index.search(home, "first")) == 2
    whole: list[str] = []
    real = index_db._index
    monkeypatch.setattr(
        index_db, "_index", lambda conn, conv, *a: whole.append(conv.id) or real(conn, conv, *a)
    )
    with (d / "messages.log").open("a") as f:
        f.write("\n=== OLLAMA -> CLAUDE [2025-08-09 11:00:00] ===\nhalf of a gecko")
    assert [h.block for h in search_index.search(home, "gecko")] == [5]
    with (d / "messages.log").open("a") as f:
        f.write(" and a newt\n\n=== CLAUDE -> OLLAMA [2025-08-09 11:05:00] ===\nthanks, okapi\n")
    assert [h.block for h in search_index.search(home, "gecko newt")] == [5]  # once, whole
    assert [h.block for h in search_index.search(home, "okapi")] == [6]
    assert whole == []  # never read whole
    (row,) = listing.page(home, listing.Query(words="growing")).rows
    assert (row["blocks"], row["turns"], row["messages"]) == (6, 3, 3)
    assert row["last_activity"] == "2025-08-09 11:05:00"
    text = (d / "messages.log").read_text()
    (d / "messages.log").write_text("a line written above it all\n" + text)  # same file
    search_index.search(home, "okapi")
    assert whole == ["growing"]  # longer, but not by an append: read whole
    with index_db.opened(home) as conn:
        conn.execute("INSERT INTO text (text) VALUES ('integrity-check')")
        assert conn.execute("SELECT count(*) FROM blocks").fetchone()[0] == 6
