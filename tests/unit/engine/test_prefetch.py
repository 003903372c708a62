"""A panel seat's stream held ahead (contemplation.engine.prefetch) on its own: taken only
for the exact request sent, bounded, and closed with nothing left (its task awaited, its
stream closed, its scheduler slot given back) whichever way it ends. The streams here are
scripted: what is tested is the holding, which no server shows on its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import pytest

from contemplation.engine.prefetch import Ahead, Prefetched
from contemplation.engine.scheduler import ModelScheduler
from contemplation.errors import BackendError
from contemplation.models import ChatMessage, ChatRequest, StreamEvent

ASKED = ChatRequest(model="m", messages=(ChatMessage(role="user", content="Q?"),))


@dataclass
class Script:
    """A stream of ``pieces`` (then it hangs when ``hang``), which records its close."""

    pieces: list[str]
    hang: bool = False
    closed: bool = False
    sent: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def stream(self) -> AsyncGenerator[StreamEvent, None]:
        try:
            for p in self.pieces:
                self.sent.append(p)
                yield StreamEvent(kind="content", text=p)
            if self.hang:
                await asyncio.Event().wait()
            await self.gate.wait()
            yield StreamEvent(kind="done")
        finally:
            self.closed = True


def held_ahead(
    sched: ModelScheduler, script: Script, *, limit: int = 1000
) -> tuple[Ahead, Prefetched]:
    held = sched.try_slot()
    assert held is not None

    async def opener() -> tuple[int | None, AsyncGenerator[StreamEvent, None]]:
        return 1, script.stream()

    ahead = Ahead()
    entry = Prefetched("c#TWO", "box", ASKED, held, opener, limit=limit)
    ahead.put(entry)
    return ahead, entry


def test_a_slot_is_taken_ahead_only_when_free_and_nobody_waits() -> None:
    async def main() -> None:
        sched = ModelScheduler(slots=1)
        async with sched.slot("m"):
            assert sched.try_slot() is None  # a one-slot server: never queued behind
        two = ModelScheduler(slots=2)
        async with two.slot("m"):
            waiter = asyncio.create_task(_take(two))
            got = two.try_slot()
            assert got is not None and two.running == 2
            await asyncio.sleep(0)
            assert two.waiting == 1 and two.try_slot() is None  # a turn waits: not taken
            got.release()
            await waiter
        assert two.running == 0

    asyncio.run(main())


async def _take(sched: ModelScheduler) -> None:
    async with sched.slot("m"):
        pass


def test_the_exact_request_takes_the_held_events_then_the_rest_live() -> None:
    async def main() -> None:
        sched = ModelScheduler(slots=2)
        script = Script(["a", "b"])
        ahead, entry = held_ahead(sched, script)
        for _ in range(100):
            await asyncio.sleep(0)
        assert [e.text for e in entry.events] == ["a", "b"] and not script.closed
        got = await ahead.claim("c#TWO", ["box"])
        assert got is entry and got.slot == 1
        stream = await ahead.take("c#TWO", "box", ASKED)
        assert stream is not None
        script.gate.set()
        kinds = [(e.kind, e.text) async for e in stream]
        assert kinds == [("content", "a"), ("content", "b"), ("done", "")]
        assert script.closed and len(script.sent) == 2  # one request, read once
        await ahead.drop("c#TWO")
        assert sched.running == 1  # claimed: the turn gives the slot back, not the prefetch
        entry.held.release()
        assert sched.running == 0

    asyncio.run(main())


def test_another_request_closes_the_held_stream_and_is_sent_anew() -> None:
    async def main() -> None:
        sched = ModelScheduler(slots=2)
        script = Script(["a"], hang=True)
        ahead, entry = held_ahead(sched, script)
        await asyncio.sleep(0)
        other = ChatRequest(model="m", messages=(ChatMessage(role="user", content="Other?"),))
        assert await ahead.take("c#TWO", "box", other) is None
        assert script.closed and entry.events == []
        await ahead.close()
        assert sched.running == 0 and not ahead.entries

    asyncio.run(main())


def test_past_its_bound_it_stops_holding_and_its_turn_asks_afresh() -> None:
    async def main() -> None:
        sched = ModelScheduler(slots=2)
        script = Script(["x" * 40] * 100, hang=True)
        ahead, entry = held_ahead(sched, script, limit=100)
        for _ in range(200):
            await asyncio.sleep(0)
        assert entry.dropped.startswith("over its bound") and entry.events == []
        assert script.closed and len(script.sent) == 3  # stopped reading at the bound
        assert await ahead.claim("c#TWO", ["box"]) is None  # its slot given back at once
        assert sched.running == 0 and not ahead.entries

    asyncio.run(main())


def test_closing_a_session_leaves_no_task_no_stream_no_slot() -> None:
    async def main() -> None:
        sched = ModelScheduler(slots=3)
        hung = Script(["a"], hang=True)
        ahead, entry = held_ahead(sched, hung)
        await asyncio.sleep(0)
        task = entry._task
        await ahead.close()
        assert task is not None and task.done() and hung.closed
        assert sched.running == 0 and not ahead.entries
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == []

    asyncio.run(main())


def test_a_server_that_runs_models_side_by_side_lends_a_seat_of_another_model_a_side_slot() -> None:
    """Ollama (``models_at_once``): with its one slot held by model ``a``, a seat of ``b``
    asked ahead gets a side slot at once, another of ``b`` (running already) or of ``a`` does
    not, nor does any while a turn waits; giving a side slot back frees none of the slots
    the queued turns count on. A one-slot server without it lends none."""

    async def main() -> None:
        plain = ModelScheduler(slots=1)
        async with plain.slot("a"):
            assert plain.try_slot("b") is None  # llama-server with one slot: one at a time
        ollama = ModelScheduler(slots=1, models_at_once=True)
        async with ollama.slot("a"):
            b = ollama.try_slot("b")
            c = ollama.try_slot("c")
            assert b is not None and c is not None and b.side and c.side
            assert ollama.try_slot("b") is None and ollama.try_slot("a") is None
            assert ollama.running == 1  # side slots are not the server's slots
            waiter = asyncio.create_task(_take(ollama))
            await asyncio.sleep(0)
            assert ollama.waiting == 1 and ollama.try_slot("d") is None  # a turn waits
            b.release()
            await asyncio.sleep(0)
            assert ollama.waiting == 1 and ollama.running == 1  # still waits for the slot
            c.release()
        await waiter
        assert ollama.running == 0 and ollama.try_slot("b") is not None

    asyncio.run(main())


def test_a_request_refused_ahead_is_its_turns_failure_not_sent_again() -> None:
    """The server refused the seat's request sent ahead before any event (its model is
    missing: 404): the seat's turn takes that refusal as its stream's failure, on the slot
    the prefetch held, and the request is not sent a second time."""

    async def main() -> None:
        sched = ModelScheduler(slots=2)
        missing = BackendError("model 'x' not found", transient=False, status_code=404)
        sent: list[str] = []

        async def refused() -> AsyncGenerator[StreamEvent, None]:
            sent.append("asked")
            raise missing
            yield StreamEvent(kind="done")  # (never: a generator, as a stream is)

        held = sched.try_slot("x")
        assert held is not None

        async def opener() -> tuple[int | None, AsyncGenerator[StreamEvent, None]]:
            return None, refused()

        ahead = Ahead()
        entry = Prefetched("c#TWO", "box", ASKED, held, opener, limit=1000)
        ahead.put(entry)
        got = await ahead.claim("c#TWO", ["box"])
        assert got is entry and entry.error is missing  # the turn takes its slot
        stream = await ahead.take("c#TWO", "box", ASKED)
        assert stream is not None
        with pytest.raises(BackendError) as raised:
            await anext(stream)
        assert raised.value is missing and sent == ["asked"]  # asked once
        await ahead.drop("c#TWO")
        entry.held.release()
        assert sched.running == 0

    asyncio.run(main())
