"""Restart-proof KV: the slot files a server keeps for idle conversations are a
bounded pool (10,000 conversations: at most ``FILES`` names, no new one past ``BYTES``), and a
restore that the next turn finds did not hold is counted; two in a row stop restores on
that server. The keeper stands for llama-server's ``/slots`` save and restore, answering as
it does (tokens and bytes), with ``holds`` False as llama.cpp #26676: success said, nothing
restored."""

from __future__ import annotations

import asyncio

from contemplation.engine.affinity import CopiesSlots, KeepsSlots, SlotAffinity
from contemplation.engine.kvfiles import FILES, KvFiles


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
