"""Which server slot a turn names (llama-server ``id_slot``, issue 39): a conversation keeps
the slot that holds its history unless it is busy and another is free; a burst of new
conversations of one template prefills its prefix in one slot at a time and the others
join the slots that hold it; no unused slot left, the free one holding the prefix, else the
one used longest ago."""

from __future__ import annotations

from contemplation.engine.affinity import KEPT, SlotAffinity


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


def test_a_burst_of_one_template_prefills_its_prefix_once_at_a_time() -> None:
    aff = SlotAffinity()
    first = aff.take("conv-1", "research", slots=4)
    aff.give(first)
    burst = [aff.take(f"conv-{i}", "research", slots=4) for i in range(2, 6)]
    cold = [s for s in burst if s != first]
    assert len(set(cold)) == 1, burst  # one new slot prefills the prefix; the rest join
    assert first in burst
    for s in burst:
        aff.give(s)
    later = aff.take("conv-9", "research", slots=4)
    assert later not in burst  # nothing prefilling now: the next unused slot is taken


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


def test_the_prefill_is_over_when_its_turn_ends_not_when_the_queue_behind_it_does() -> None:
    aff = SlotAffinity()
    first = aff.take("conv-1", "research", slots=2)
    queued = aff.take("conv-2", "research", slots=2)
    assert queued == first  # joins the slot prefilling the prefix
    aff.give(first)  # conv-1 is done: its slot holds the prefix, conv-2 runs there now
    assert aff.take("conv-3", "research", slots=2) != first  # no wait: the unused slot
