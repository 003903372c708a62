"""ModelScheduler on its own: who gets a free slot, how many run at once, and that a turn
cancelled while it waits (or just as it is granted a slot) gives nothing away."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import pytest

from contemplation.engine.scheduler import GRANTS_KEPT, Held, ModelScheduler
from tests.conftest import within

T = TypeVar("T")


class Turns:
    """Tasks that each take a slot for one model and hold it until they are released."""

    def __init__(self, sched: ModelScheduler) -> None:
        self.sched = sched
        self.order: list[str] = []  # names in the order they got a slot
        self.inside = 0
        self.most_inside = 0
        self.asked: dict[str, asyncio.Event] = {}
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.granted: asyncio.Queue[str] = asyncio.Queue()

    def start(self, name: str, model: str) -> asyncio.Task[None]:
        self.asked[name] = asyncio.Event()
        self.release[name] = asyncio.Event()

        async def turn() -> None:
            # slot() queues the waiter before its first await, so once a test wakes up on
            # "asked", this turn is in the scheduler's queue (or holds a slot)
            self.asked[name].set()
            async with self.sched.slot(model):
                self.order.append(name)
                self.granted.put_nowait(name)
                self.inside += 1
                self.most_inside = max(self.most_inside, self.inside)
                try:
                    await self.release[name].wait()
                finally:
                    self.inside -= 1

        task = asyncio.create_task(turn(), name=name)
        self.tasks[name] = task
        return task

    async def queue(self, name: str, model: str) -> None:
        """Start a turn and return once it waits in the scheduler (or holds a slot)."""
        self.start(name, model)
        await within(self.asked[name].wait(), f"{name} to ask for a slot")

    async def next_granted(self) -> str:
        return await within(self.granted.get(), "a turn to get a slot")

    async def finish(self, name: str) -> None:
        """Let ``name`` go; when this returns, its slot has been handed on (if anyone waits)."""
        self.release[name].set()
        await within(self.tasks[name], f"{name} to end")

    async def drain(self) -> None:
        """Release every turn, each as soon as it has a slot, in the order they got one."""
        while any(not t.done() for t in self.tasks.values()):
            holding = [n for n in self.order if not self.tasks[n].done()]
            await self.finish(holding[0] if holding else await self.next_granted())


def test_turns_of_one_model_get_the_slot_in_arrival_order() -> None:
    async def scenario() -> None:
        sched = ModelScheduler(slots=1)
        turns = Turns(sched)
        for name in ("a1", "a2", "a3", "a4", "a5"):
            await turns.queue(name, "m")
        assert (sched.running, sched.waiting) == (1, 4)
        await turns.drain()
        assert turns.order == ["a1", "a2", "a3", "a4", "a5"]
        assert (sched.running, sched.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_free_slot_stays_with_the_model_that_ran_last_until_switch_after() -> None:
    """b1 arrived before a2..a5, but the server has model a loaded: a runs up to
    switch_after (3) turns in a row, then b gets its turn, then a again."""

    async def scenario() -> None:
        sched = ModelScheduler(slots=1, switch_after=3)
        turns = Turns(sched)
        await turns.queue("a1", "a")
        await turns.queue("b1", "b")
        for name in ("a2", "a3", "a4", "a5"):
            await turns.queue(name, "a")
        await turns.drain()
        assert turns.order == ["a1", "a2", "a3", "b1", "a4", "a5"]
        assert sched.granted == ["a", "a", "a", "b", "a", "a"]

    asyncio.run(scenario())


def test_when_the_streak_ends_the_longest_waiting_other_model_goes_next() -> None:
    """When a's turn ends, b and c both wait: c has waited longer (c1 came before b2), so c
    goes first, although b was seen by the scheduler earlier (b1)."""

    async def scenario() -> None:
        sched = ModelScheduler(slots=1, switch_after=1)
        turns = Turns(sched)
        await turns.queue("a1", "a")
        await turns.queue("b1", "b")
        assert await turns.next_granted() == "a1"
        await turns.finish("a1")
        assert await turns.next_granted() == "b1"
        await turns.queue("a2", "a")
        await turns.finish("b1")
        assert await turns.next_granted() == "a2"
        await turns.queue("c1", "c")
        await turns.queue("b2", "b")
        await turns.drain()
        assert turns.order == ["a1", "b1", "a2", "c1", "b2"]
        assert sched.granted == ["a", "b", "a", "c", "b"]

    asyncio.run(scenario())


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_never_more_turns_at_once_than_slots(slots: int) -> None:
    async def scenario() -> None:
        sched = ModelScheduler(slots=slots, switch_after=2)
        turns = Turns(sched)
        names = [f"t{i}" for i in range(8)]
        for i, name in enumerate(names):
            await turns.queue(name, "ab"[i % 2])
        assert sched.running == slots
        assert sched.waiting == 8 - slots
        assert turns.inside == slots
        await turns.drain()
        assert sorted(turns.order) == sorted(names)
        assert turns.most_inside == slots
        assert (sched.running, sched.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_turn_that_raises_inside_its_slot_gives_the_slot_back() -> None:
    async def scenario() -> None:
        sched = ModelScheduler(slots=1)
        with pytest.raises(RuntimeError):
            async with sched.slot("m"):
                raise RuntimeError("the turn failed")
        assert sched.running == 0
        async with asyncio.timeout(1), sched.slot("m"):
            assert sched.running == 1

    asyncio.run(scenario())


def test_a_turn_cancelled_while_queued_leaks_no_slot_and_is_skipped() -> None:
    async def scenario() -> None:
        sched = ModelScheduler(slots=1)
        turns = Turns(sched)
        await turns.queue("a1", "a")
        await turns.queue("x", "x")
        await turns.queue("b1", "b")
        assert sched.waiting == 2
        turns.tasks["x"].cancel()
        with pytest.raises(asyncio.CancelledError):
            await turns.tasks["x"]
        assert sched.waiting == 1  # counted out as soon as it was cancelled
        await turns.drain()
        assert turns.order == ["a1", "b1"]
        assert sched.granted == ["a", "b"]  # the cancelled waiter was never granted
        assert (sched.running, sched.waiting) == (0, 0)
        async with asyncio.timeout(1), sched.slot("y"):  # the slot is free, not leaked
            assert sched.running == 1

    asyncio.run(scenario())


def test_a_turn_cancelled_just_after_it_was_granted_gives_the_slot_back() -> None:
    """The slot is handed over (the waiter's future is resolved) but the waiting task is
    cancelled before it resumes: the slot must go to the next turn, not vanish."""

    async def scenario() -> None:
        sched = ModelScheduler(slots=1)
        holder: AbstractAsyncContextManager[Held] = sched.slot("a")
        await holder.__aenter__()
        turns = Turns(sched)
        await turns.queue("granted", "a")
        await turns.queue("next", "b")
        await holder.__aexit__(None, None, None)  # hands the slot to "granted" ...
        assert sched.running == 1
        turns.tasks["granted"].cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await turns.tasks["granted"]
        assert await turns.next_granted() == "next"
        await turns.finish("next")
        assert (sched.running, sched.waiting) == (0, 0)

    asyncio.run(scenario())


def test_an_early_release_hands_the_slot_on_at_once_and_only_once() -> None:
    """A turn gives its slot back when the stream ends, before it commits the reply: the next
    turn starts then, and leaving the block afterwards frees nothing a second time."""

    async def scenario() -> None:
        sched = ModelScheduler(slots=1)
        turns = Turns(sched)
        async with sched.slot("a") as held:
            await turns.queue("b1", "b")
            assert turns.order == []
            held.release()
            assert await turns.next_granted() == "b1"  # while the first is still in its block
            held.release()
            assert (sched.running, sched.waiting) == (1, 0)
        assert sched.running == 1  # b1 still holds the only slot
        await turns.queue("c1", "c")
        assert (sched.running, sched.waiting) == (1, 1)
        await turns.finish("b1")
        assert await turns.next_granted() == "c1"
        await turns.finish("c1")
        assert (sched.running, sched.waiting) == (0, 0)

    asyncio.run(scenario())


def test_the_grant_history_stays_bounded() -> None:
    async def scenario() -> None:
        sched = ModelScheduler(slots=1)
        for i in range(2 * GRANTS_KEPT + 10):
            async with sched.slot(f"m{i % 3}"):
                pass
        assert GRANTS_KEPT <= len(sched.granted) <= 2 * GRANTS_KEPT
        last = 2 * GRANTS_KEPT + 9
        assert sched.granted[-1] == f"m{last % 3}"

    asyncio.run(scenario())
