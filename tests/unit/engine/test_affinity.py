"""Which server slot a turn names (llama-server ``id_slot``): a conversation keeps
the slot that holds its history unless it is busy and another is free; a burst of new
conversations of one template prefills its prefix in one slot at a time and the others
join the slots that hold it; no unused slot left, the free one holding the prefix, else the
one used longest ago. Where the server copies slots (llama-server's ``/slots`` save and
restore), a burst takes every unused slot at once, each with a copy of an idle slot that
holds its prefix, and a turn on that slot waits for the copies out of it (the server copies
only an idle slot)."""

from __future__ import annotations

import asyncio

from contemplation.engine.affinity import KEPT, CopiesSlots, SlotAffinity


class Copier:
    """Stands for the server's copy (``copy_slot``); ``done``: False, a server that
    refuses (started without ``--slot-save-path``). ``log``: what happened, in order."""

    def __init__(self, done: bool = True) -> None:
        self.done = done
        self.log: list[tuple[str, int, int]] = []

    async def copies_slots(self, idle: int) -> bool:
        await asyncio.sleep(0)
        self.log.append(("asked", idle, idle))
        return self.done

    async def copy_slot(self, source: int, target: int) -> bool:
        await asyncio.sleep(0)  # the HTTP round trip: other turns run meanwhile
        self.log.append(("copy", source, target))
        return self.done


async def _turns(aff: SlotAffinity, copier: Copier, convs: list[str], slots: int) -> list[int]:
    """Turns of ``convs`` at once, as the engine starts them (:meth:`SlotAffinity.asked`,
    ``take``, ``ready``, then the first request, logged); their slots, still taken."""

    async def turn(conv: str) -> int:
        await aff.asked()
        slot = aff.take(conv, "research", slots=slots, copy=True)
        await aff.ready(slot, copier)
        copier.log.append(("request", slot, slot))
        return slot

    return list(await asyncio.gather(*(turn(c) for c in convs)))


def test_a_conversation_keeps_its_slot() -> None:
    aff = SlotAffinity()
    a = aff.take("conv-a", "default", slots=4)
    aff.give(a)
    b = aff.take("conv-b", "default", slots=4)
    aff.give(b)
    assert b != a  # an unused slot is free: conv-a's history is not evicted
    assert aff.take("conv-a", "default", slots=4) == a
    assert aff.take("conv-b", "default", slots=4) == b


def test_a_busy_slot_is_left_for_a_free_one() -> None:
    aff = SlotAffinity()
    a = aff.take("conv-a", "default", slots=2)  # still busy (its reply is streaming)
    moved = aff.take("conv-a", "default", slots=2)
    assert moved != a
    aff.give(a)
    aff.give(moved)
    assert aff.take("conv-a", "default", slots=2) == moved  # it holds its history now
    assert aff.take("conv-b", "other", slots=1) == 0  # every slot busy: queued on one


def test_a_burst_never_queues_behind_a_busy_slot_while_another_is_free() -> None:
    """Measured on an H200 (16 slots, bench/gpu/run.sh): a burst that joined the slot
    prefilling its template's prefix kept at most 10 of 16 slots busy and ran at 0.77x a
    direct client's tokens/s; the server queues a request that names a busy slot."""
    aff = SlotAffinity()
    first = aff.take("conv-1", "research", slots=4)
    aff.give(first)  # its slot holds the prefix, free
    burst = [aff.take(f"conv-{i}", "research", slots=4) for i in range(2, 6)]
    assert sorted(burst) == [0, 1, 2, 3], burst  # every slot busy at once
    assert burst[-1] == first  # the unused ones first (no cache evicted), then the warm one
    queued = aff.take("conv-6", "research", slots=4)  # every slot carries a turn: queued
    assert queued in burst
    for s in [*burst, queued]:
        aff.give(s)


def test_with_every_slot_used_the_prefix_then_the_oldest() -> None:
    aff = SlotAffinity()
    order = []
    for i in range(3):
        order.append(aff.take(f"c{i}", f"t{i}", slots=3))
        aff.give(order[-1])
    assert sorted(order) == [0, 1, 2]
    assert aff.take("c8", "t1", slots=3) == order[1]  # the slot holding its prefix
    assert aff.take("c9", "t9", slots=3) == order[0]  # the one used longest ago


def test_a_smaller_server() -> None:
    aff = SlotAffinity()
    aff.give(aff.take("conv-a", "default", slots=4))
    aff.give(aff.take("conv-b", "default", slots=4))
    assert aff.take("conv-b", "default", slots=1) == 0  # the server has one slot now


def test_what_is_remembered_stays_bounded() -> None:
    aff = SlotAffinity()
    for i in range(KEPT * 3):
        aff.give(aff.take(f"conv-{i}", f"tpl-{i}", slots=4))
    assert aff.remembered() <= KEPT


def test_a_second_conversation_takes_the_free_slot_not_the_queue_behind_the_first() -> None:
    aff = SlotAffinity()
    first = aff.take("conv-1", "research", slots=2)
    second = aff.take("conv-2", "research", slots=2)
    assert second != first  # the free slot, not the queue behind the first prefill
    aff.give(first)  # conv-1 is done: its slot holds the prefix, free
    assert aff.take("conv-3", "research", slots=2) == first  # the free slot with the prefix


def test_where_the_server_copies_slots_a_burst_takes_every_slot_with_the_prefix_copied() -> None:
    """Measured before: the bench's burst reused 71 % of the shared prompt (two unused slots
    prefilled it anew) or, held on the warm slots, left the others idle."""
    aff = SlotAffinity()
    copier = Copier()
    assert isinstance(copier, CopiesSlots)
    [first] = asyncio.run(_turns(aff, copier, ["conv-1"], 4))
    aff.give(first)  # its slot holds the prefix, idle
    burst = asyncio.run(_turns(aff, copier, [f"conv-{i}" for i in range(2, 6)], 4))
    assert sorted(burst) == [0, 1, 2, 3], burst  # every slot busy at once
    copies = [e for e in copier.log if e[0] == "copy"]
    assert sorted(copies) == sorted(("copy", first, s) for s in burst if s != first)
    on_first = copier.log.index(("request", first, first), 1)
    assert all(copier.log.index(c) < on_first for c in copies)  # copied while it was idle
    for s in burst:
        aff.give(s)
    assert aff.take("conv-9", "research", slots=4, copy=True) in burst  # every slot warm now


def test_a_server_that_refuses_to_copy_is_asked_once_and_the_burst_waits_for_its_answer() -> None:
    aff = SlotAffinity()
    copier = Copier(done=False)  # started without --slot-save-path
    [first] = asyncio.run(_turns(aff, copier, ["conv-1"], 4))
    aff.give(first)
    burst = asyncio.run(_turns(aff, copier, [f"conv-{i}" for i in range(2, 6)], 4))
    asked = [e for e in copier.log if e[0] != "request"]
    assert asked == [("asked", 1, 1)] and aff.copies is False  # asked once, of an idle slot
    assert sorted(burst) == [0, 1, 2, 3], burst  # every slot busy; the unused ones prefill
    for s in burst:
        aff.give(s)
    again = asyncio.run(_turns(aff, copier, ["conv-6"], 4))
    assert [e for e in copier.log if e[0] != "request"] == asked, again  # never again


def test_a_cold_burst_copies_the_first_prefill_into_the_other_slots_when_its_turn_ends() -> None:
    """Nothing warm: the first prefills the prefix; the others take the unused slots and
    wait for a copy of it (before: they queued behind it on its slot, one after another)."""
    aff = SlotAffinity()
    copier = Copier()

    async def burst() -> list[int]:
        turns = asyncio.ensure_future(_turns(aff, copier, [f"c{i}" for i in range(4)], 4))
        for _ in range(100):  # every turn runs until it waits (bounded: no timing)
            await asyncio.sleep(0)
        assert copier.log == [("request", 0, 0), ("asked", 1, 1)]  # the rest wait for slot 0
        aff.give(0)  # its turn ends: slot 0 holds the prefix, idle
        return await turns

    slots = asyncio.run(burst())
    assert sorted(slots) == [0, 1, 2, 3], slots
    assert sorted(e for e in copier.log if e[0] == "copy") == [("copy", 0, i) for i in (1, 2, 3)]


def test_a_turn_that_ends_before_its_copy_frees_the_slot_it_would_copy() -> None:
    aff = SlotAffinity()
    first = aff.take("conv-1", "research", slots=2, copy=True)
    aff.give(first)
    second = aff.take("conv-2", "research", slots=2, copy=True)  # a copy of first planned
    aff.give(second)  # the turn ended (cancelled) before its first request
    copier = Copier()
    again = asyncio.run(asyncio.wait_for(_turns(aff, copier, ["conv-1"], 2), 5))
    assert again == [first] and copier.log == [("request", first, first)]  # nothing to wait on


def test_a_server_that_keeps_no_named_slots_history_is_left_to_pick_after_two_misses() -> None:
    aff = SlotAffinity()
    a = aff.take("conv-a", "research", slots=4)
    aff.give(a)
    assert not aff.observed(a, "conv-a", 0)  # a new conversation's slot: nothing expected
    again = aff.take("conv-a", "research", slots=4)  # its own slot: its history expected
    aff.give(again)
    assert not aff.observed(again, "conv-a", 120)  # found: no miss
    for miss in range(2):
        slot = aff.take("conv-a", "research", slots=4)
        aff.give(slot)
        assert aff.observed(slot, "conv-a", 0) is (miss == 1)  # decided at the second
    assert aff.named is False
    assert not aff.observed(slot, "conv-a", 0)  # said once


def test_a_turn_that_reused_its_history_resets_the_count_and_an_unknown_figure_counts_nothing() -> None:
    aff = SlotAffinity()
    aff.give(aff.take("conv-a", "t", slots=2))
    for reused in (0, None, 50, 0, None):
        slot = aff.take("conv-a", "t", slots=2)
        aff.give(slot)
        assert not aff.observed(slot, "conv-a", reused)
    assert aff.named
