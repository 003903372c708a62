"""Restart-proof KV: the slot files a server keeps for idle conversations are a
bounded pool (10,000 conversations: at most ``FILES`` names, no new one past ``BYTES``), and a
restore that the next turn finds did not hold is counted; two in a row stop restores on
that server. The keeper stands for llama-server's ``/slots`` save and restore, answering as
it does (tokens and bytes), with ``holds`` False as llama.cpp #26676: success said, nothing
restored."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

from contemplation.engine.affinity import CopiesSlots, KeepsSlots, SlotAffinity
from contemplation.engine.kvfiles import FILES, KvFiles
from contemplation.models import Usage
from contemplation.protocol import ledger
from contemplation.writer import kvmap


class Keeper:
    def __init__(self) -> None:
        self.files: dict[str, int] = {}  # name -> tokens in it
        self.slot: dict[int, int] = {}  # slot -> tokens in it
        self.log: list[tuple[str, int, str]] = []

    async def copies_slots(self, idle: int) -> bool:
        return True

    async def copy_slot(self, source: int, target: int) -> bool:
        return True

    async def keep_slot(self, slot: int, action: str, filename: str) -> tuple[int, int] | None:
        await asyncio.sleep(0)
        self.log.append((action, slot, filename))
        if action == "save":
            self.files[filename] = self.slot.get(slot, 0)
            return self.files[filename], self.files[filename] * 1000
        if filename not in self.files:
            return None
        self.slot[slot] = self.files[filename]
        return self.files[filename], self.files[filename] * 1000


def _turn(aff: SlotAffinity, keeper: Keeper, conv: str, tokens: int, reused: int) -> str:
    """One turn of ``conv`` on a one-slot server: its prompt is ``tokens``; the server says
    it reused ``reused`` of them (the slot then holds the whole prompt)."""

    async def run() -> int:
        slot = aff.take(conv, "default", slots=1, copy=True)
        await aff.ready(slot, keeper)
        return slot

    slot = asyncio.run(run())
    keeper.slot[slot] = tokens
    aff.give(slot)
    return aff.verified(slot, conv, reused, tokens)


def test_the_keeper_is_what_the_engine_asks_for() -> None:
    assert isinstance(Keeper(), KeepsSlots) and isinstance(Keeper(), CopiesSlots)


def test_ten_thousand_conversations_cost_at_most_the_pools_files() -> None:
    files = KvFiles()
    for i in range(10_000):
        conv = f"conv-{i}"
        files.saved(conv, files.name_for(conv), tokens=100, history=90, size=1 << 20)
    assert len(files) <= FILES
    assert files.kept("conv-9999") is not None and files.kept("conv-0") is None
    names = {files.name_for(f"conv-{i}") for i in range(10_000 - FILES, 10_000)}
    assert len(names) == FILES  # each kept conversation has a file of its own


def test_no_new_file_past_the_byte_budget() -> None:
    files = KvFiles(budget=3 << 20)
    for i in range(20):
        conv = f"conv-{i}"
        files.saved(conv, files.name_for(conv), tokens=100, history=90, size=1 << 20)
    assert len(files) == 3 and files.size() == 3 << 20


def test_a_conversation_back_after_another_took_its_slot_has_its_file_restored() -> None:
    aff, keeper = SlotAffinity(), Keeper()
    assert _turn(aff, keeper, "a", 300, 0) == ""
    assert _turn(aff, keeper, "b", 280, 200) == ""  # a's slot saved first
    assert keeper.log[0][0] == "save"
    assert _turn(aff, keeper, "a", 360, 300) == "restored"  # b saved, a restored
    assert [x for x, _, _ in keeper.log] == ["save", "save", "restore"]
    assert aff.restores_failed == 0


def test_restores_that_do_not_hold_are_counted_and_two_in_a_row_stop_them() -> None:
    aff, keeper = SlotAffinity(), Keeper()
    _turn(aff, keeper, "a", 300, 0)
    _turn(aff, keeper, "b", 280, 200)
    assert _turn(aff, keeper, "a", 360, 200) == "failed"  # success said, the prefix reused
    assert _turn(aff, keeper, "b", 340, 200) == "off"
    assert aff.restores_failed == 2 and not aff.restores
    asked = len(keeper.log)
    _turn(aff, keeper, "a", 400, 200)
    _turn(aff, keeper, "b", 380, 200)
    assert len(keeper.log) == asked  # nothing saved or restored any more


# --------------------------------------------------------------------- warm across restarts


def _home(tmp_path: Path, *convs: str) -> Path:
    for conv in convs:
        (tmp_path / "active" / conv).mkdir(parents=True)
    return tmp_path


def _flush(files: KvFiles) -> None:
    asyncio.run(files.flush())


def test_the_pool_is_kept_in_the_home_owner_only_and_read_back_by_a_new_daemon(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path, "conv-a", "conv-b")
    files = KvFiles.durable(home, "llama")
    for conv in ("conv-a", "conv-b"):
        files.saved(conv, files.name_for(conv), tokens=400, history=390, size=1 << 20,
                    said=(1, 2, 3))  # fmt: skip
    files.kept("conv-a")  # the most recent now
    _flush(files)
    assert stat.S_IMODE((home / kvmap.FILE).stat().st_mode) == 0o600
    again = KvFiles.durable(home, "llama")
    assert len(again) == 2 and list(again._kept) == ["conv-b", "conv-a"]  # LRU order kept
    a = again.kept("conv-a")
    assert a is not None and (a.tokens, a.history, a.said) == (400, 390, (1, 2, 3))
    # a name says nothing of its conversation, and no two are alike
    assert kvmap.NAME.match(a.name) and "conv" not in a.name
    assert a.name != again.name_for("conv-b")
    assert KvFiles.durable(home, "other") is not None and len(KvFiles.durable(home, "other")) == 0


def test_a_new_daemon_never_writes_over_a_file_the_map_gives_to_a_conversation(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path, "conv-a", "conv-new")
    files = KvFiles.durable(home, "llama")
    files.saved("conv-a", files.name_for("conv-a"), tokens=10, history=9, size=10)
    _flush(files)
    again = KvFiles.durable(home, "llama")
    kept = again.kept("conv-a")
    assert kept is not None and again.name_for("conv-new") != kept.name


def test_files_of_conversations_gone_are_dropped_and_their_names_written_over(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path, "conv-a", "conv-b")
    files = KvFiles.durable(home, "llama")
    for conv in ("conv-a", "conv-b"):
        files.saved(conv, files.name_for(conv), tokens=10, history=9, size=10)
    _flush(files)
    b = files.kept("conv-b")
    assert b is not None
    (home / "active" / "conv-b").rmdir()  # archived, deleted or pruned
    again = KvFiles.durable(home, "llama")
    assert "conv-b" not in again and "conv-a" in again
    (home / "active" / "conv-c").mkdir()
    assert again.name_for("conv-c") == b.name  # written over, no new file


def test_a_name_the_daemon_did_not_make_is_never_read_from_the_map(tmp_path: Path) -> None:
    home = _home(tmp_path, "conv-a", "conv-b")
    entry = {"conv": "conv-a", "name": "../../home/other/secret.bin", "tokens": 1,
             "history": 1, "size": 1, "said": []}  # fmt: skip
    good = entry | {"conv": "conv-b", "name": "contemplation-kv-" + "ab" * 12 + ".bin"}
    data = {"version": kvmap.VERSION, "providers": {"llama": {"entries": [entry, good]}}}
    (home / kvmap.FILE).write_text(json.dumps(data))
    files = KvFiles.durable(home, "llama")
    assert "conv-a" not in files and "conv-b" in files
    (home / kvmap.FILE).write_text("{not json")
    assert len(KvFiles.durable(home, "llama")) == 0  # unreadable: made anew


def test_an_evicted_conversation_is_remembered_across_a_restart(tmp_path: Path) -> None:
    home = _home(tmp_path, *(f"conv-{i}" for i in range(3)))
    files = KvFiles.durable(home, "llama", budget=2 << 20)
    for i in range(3):
        conv = f"conv-{i}"
        files.saved(conv, files.name_for(conv), tokens=10, history=9, size=1 << 20)
    assert "conv-0" not in files and files.was_evicted("conv-0")
    _flush(files)
    assert KvFiles.durable(home, "llama").was_evicted("conv-0")


def test_files_of_another_model_are_given_up() -> None:
    files = KvFiles()
    assert files.made_by("a.gguf")  # the first model known
    files.saved("conv-a", files.name_for("conv-a"), tokens=10, history=9, size=10)
    assert files.made_by("a.gguf") and "conv-a" in files
    assert not files.made_by("b.gguf") and "conv-a" not in files


class ModelKeeper(Keeper):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    async def served_model(self) -> str:
        return self.model


def _restart_turn(aff: SlotAffinity, keeper: Keeper, conv: str) -> str:
    async def run() -> str:
        slot = aff.take(conv, "default", slots=1, copy=True)
        await aff.ready(slot, keeper)
        aff.give(slot)
        await aff.settled()
        return aff.verified(slot, conv, 0, 500)

    return asyncio.run(run())


def test_a_turn_after_a_restart_says_why_its_file_did_not_serve() -> None:
    # its file is gone from the server (a removed --slot-save-path): counted, cold
    aff, keeper = SlotAffinity(), ModelKeeper("a.gguf")
    aff.files.saved("conv-a", "contemplation-kv-x.bin", tokens=400, history=400, size=1)
    assert _restart_turn(aff, keeper, "conv-a") == "failed" and aff.restores_failed == 1
    assert ledger.miss(Usage(cached_tokens=0), held=None, extends=False,
                       restore="failed") == "restore failed"  # fmt: skip
    # files of another model are never restored
    aff, keeper = SlotAffinity(), ModelKeeper("b.gguf")
    aff.files.model = "a.gguf"
    aff.files.saved("conv-a", "contemplation-kv-x.bin", tokens=400, history=400, size=1)
    keeper.files["contemplation-kv-x.bin"] = 400
    assert _restart_turn(aff, keeper, "conv-a") == "model changed"
    assert not [a for a, _, _ in keeper.log if a == "restore"]
    # its file was given up to another conversation
    aff, keeper = SlotAffinity(), ModelKeeper("a.gguf")
    aff.files.evicted("conv-a")
    assert _restart_turn(aff, keeper, "conv-a") == "evicted"
    assert ledger.miss(Usage(cached_tokens=0), held=None, extends=False,
                       restore="evicted") == "file evicted"  # fmt: skip


def test_a_turns_slot_is_saved_once_the_server_is_idle_without_another_taking_it() -> None:
    aff, keeper = SlotAffinity(), Keeper()

    async def run() -> None:
        slot = aff.take("a", "default", slots=2, copy=True)
        await aff.ready(slot, keeper)
        keeper.slot[slot] = 300
        aff.verified(slot, "a", 0, 300)
        aff.give(slot)  # the reply is committed: nothing waits on the save
        assert not [a for a, _, _ in keeper.log if a == "save"]
        await aff.settled()

    asyncio.run(run())
    assert [a for a, _, _ in keeper.log] == ["save"]
    kept = aff.files.kept("a")
    assert kept is not None and kept.history == 300


def test_an_older_snapshot_of_the_pool_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    home = _home(tmp_path, "conv-a", "conv-b")
    one = kvmap.Saved("m", (kvmap.Entry("conv-a", "contemplation-kv-" + "a" * 24 + ".bin",
                                        1, 1, 1, ()),))  # fmt: skip
    two = kvmap.Saved("m", (*one.entries, kvmap.Entry("conv-b", "contemplation-kv-" + "b" * 24
                                                      + ".bin", 1, 1, 1, ())))  # fmt: skip
    older, newer = kvmap.snapshot(), kvmap.snapshot()
    kvmap.store(home, "llama", two, newer)
    kvmap.store(home, "llama", one, older)  # its thread ended last
    assert len(kvmap.load(home, "llama").entries) == 2
    files = KvFiles.durable(home, "llama")  # a new pool (a restarted provider) still writes
    files.drop("conv-a")
    _flush(files)
    assert [e.conv for e in kvmap.load(home, "llama").entries] == ["conv-b"]
