"""The Dispatcher on its own: one task per conversation, a poke during a run runs it again,
wake-up times become timers, a cancel stops the task for real, the daemon's own log writes
do not start work, and the periodic rescan pokes only where there is a sign of new work.

Two kinds of test: with ``process_safely`` replaced by a script (what the dispatcher decides,
exactly), and with the real pipeline and the in-process fake backend (what it means for a
conversation's folder).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from contemplation.daemon import dispatcher as dispatcher_mod
from contemplation.daemon.dispatcher import Dispatcher
from contemplation.engine.runtime import Runtime
from contemplation.engine.tracking import Tracked
from contemplation.errors import BackendError, ErrorKind
from contemplation.models import MarkerKind, Status
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, request_cancel
from tests.conftest import poll, runtime_for, within
from tests.fakes.backend import FakeBackend, Reply, install

T = TypeVar("T")


def runtime(make_settings: Callable[..., Settings]) -> Runtime:
    return runtime_for(make_settings())


# --------------------------------------------------------------------------- scripted steps


@dataclass
class Step:
    """What one scripted ``process`` call does: wait for ``gate``, remember the log's size as
    the real step does when it is done writing, run ``then`` (what happens after: a hand
    append), and ask to be woken ``wake_in`` seconds from now (None: only on an event)."""

    gate: asyncio.Event | None = None
    wake_in: float | None = None
    then: Callable[[Conv, Tracked], None] | None = None


class Script:
    """Stands in for ``pipeline.process_safely``; records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []  # (conversation, wall time)
        self.called: asyncio.Queue[str] = asyncio.Queue()
        self.plans: dict[str, deque[Step]] = {}

    def plan(self, conv_id: str, *steps: Step) -> None:
        self.plans.setdefault(conv_id, deque()).extend(steps)

    def ids(self) -> list[str]:
        return [c for c, _ in self.calls]

    async def next_call(self) -> str:
        return await within(self.called.get(), "a process() call")

    async def __call__(self, conv: Conv, rt: Runtime, seen: Tracked) -> float | None:
        self.calls.append((conv.id, time.time()))
        self.called.put_nowait(conv.id)
        plan = self.plans.get(conv.id)
        step = plan.popleft() if plan else Step()
        if step.gate is not None:
            await step.gate.wait()
        seen.remember_size(conv)
        if step.then is not None:
            step.then(conv, seen)
        return None if step.wake_in is None else time.time() + step.wake_in


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    s = Script()
    monkeypatch.setattr(dispatcher_mod, "process_safely", s)
    return s


def conv_dir(rt: Runtime, conv_id: str, *, log: bytes = b"") -> Path:
    d = rt.home.active / conv_id
    (d / "inbox").mkdir(parents=True)
    (d / "messages.log").write_bytes(log)
    return d


def test_a_poke_during_a_run_marks_it_dirty_and_it_runs_once_more(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        gate = asyncio.Event()
        script.plan("c1", Step(gate=gate))
        d.poke("c1")
        task = d.tasks["c1"]
        assert await script.next_call() == "c1"
        d.poke("c1")
        d.poke("c1")  # any number of pokes during a run: one more run
        assert d.dirty == {"c1"}
        assert d.tasks == {"c1": task}  # still one task for the conversation
        gate.set()
        await within(task, "the task to end")
        assert script.ids() == ["c1", "c1"]
        assert (d.tasks, d.dirty, d.timers) == ({}, set(), {})

    asyncio.run(scenario())


def test_conversations_run_side_by_side_one_task_each(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        gates = {c: asyncio.Event() for c in ("a", "b")}
        for c, g in gates.items():
            script.plan(c, Step(gate=g))
            d.poke(c)
        assert {await script.next_call(), await script.next_call()} == {"a", "b"}
        assert set(d.tasks) == {"a", "b"} and d.busy
        for g in gates.values():
            g.set()
        await within(asyncio.gather(*d.tasks.values()), "both tasks")
        assert sorted(script.ids()) == ["a", "b"] and not d.busy

    asyncio.run(scenario())


def test_a_wake_time_becomes_a_timer_that_pokes_again(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        second = asyncio.Event()
        script.plan("c1", Step(wake_in=0.05), Step(gate=second))
        d.poke("c1")
        task = d.tasks["c1"]
        assert await script.next_call() == "c1"
        await within(task, "the first run")
        assert "c1" in d.timers and "c1" not in d.tasks  # asleep, not spinning
        woke_at = script.calls[0][1] + 0.05
        assert await script.next_call() == "c1"  # the timer fired and poked
        assert script.calls[1][1] >= woke_at - 0.01
        assert "c1" not in d.timers
        second.set()
        await within(d.tasks["c1"], "the second run")
        assert script.ids() == ["c1", "c1"] and d.timers == {}

    asyncio.run(scenario())


def test_a_poke_cancels_the_pending_timer(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        script.plan("c1", Step(wake_in=3600))
        d.poke("c1")
        await within(d.tasks["c1"], "the first run")
        timer = d.timers["c1"]
        d.poke("c1")  # an event came before the wake-up time
        assert timer.cancelled()
        assert "c1" not in d.timers
        await within(d.tasks["c1"], "the second run")
        assert script.ids() == ["c1", "c1"] and d.timers == {}

    asyncio.run(scenario())


def test_a_hand_append_during_a_run_is_looked_at_when_the_run_ends(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        log = conv_dir(rt, "c1", log=b"x" * 10) / "messages.log"

        def a_hand_appends(conv: Conv, seen: Tracked) -> None:
            with log.open("ab") as f:
                f.write(b"appended by hand\n")

        script.plan("c1", Step(then=a_hand_appends))
        d.poke("c1")
        await within(d.tasks["c1"], "the runs")
        assert script.ids() == ["c1", "c1"]

    asyncio.run(scenario())


def test_the_echo_of_the_daemons_own_log_writes_starts_nothing(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        log = conv_dir(rt, "c1", log=b"reply written by the daemon\n") / "messages.log"
        gate = asyncio.Event()
        script.plan("c1", Step(), Step(gate=gate))
        assert d._log_moved("c1") is None  # never seen: a log poke starts a look
        d.poke("c1", None, True)
        task = d.tasks["c1"]
        assert await script.next_call() == "c1"
        await within(task, "the first run")
        assert d._log_moved("c1") is False

        d.poke("c1", None, True)  # inotify's echo of the daemon's own append
        assert "c1" not in d.tasks and script.ids() == ["c1"]

        d.poke("c1")  # a run that appends to the log ...
        task = d.tasks["c1"]
        assert await script.next_call() == "c1"
        with log.open("ab") as f:
            f.write(b"more of the reply\n")
        d.poke("c1", None, True)  # ... sees its echo during the run: not dirty
        assert d.dirty == set()
        gate.set()
        await within(task, "the second run")
        assert script.ids() == ["c1", "c1"]

        with log.open("ab") as f:
            f.write(b"=== CLAUDE -> OLLAMA [2026-01-19 10:00:00] ===\nby hand\n")
        assert d._log_moved("c1") is True
        d.poke("c1", None, True)  # a hand append is new work
        assert "c1" in d.tasks
        await within(d.tasks["c1"], "the third run")
        assert script.ids() == ["c1", "c1", "c1"]

    asyncio.run(scenario())


def test_rescan_pokes_only_conversations_that_show_new_work(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        names = [
            "quiet", "fresh", "grown", "inbox", "dotfile", "processing", "cancel", "busy", "asleep"
        ]  # fmt: skip
        for name in names:
            conv_dir(rt, name, log=b"12345")
            if name != "fresh":
                d.seen.remember_size(Conv(rt.home.active / name))
        (rt.home.active / "grown" / "messages.log").write_bytes(b"123456")
        (rt.home.active / "inbox" / "inbox" / "q.txt").write_text("hi")
        (rt.home.active / "dotfile" / "inbox" / ".q.txt.tmp").write_text("being written")
        (rt.home.active / "processing" / "processing").mkdir()
        (rt.home.active / "processing" / "processing" / "q.txt").write_text("claimed")
        (rt.home.active / "cancel" / ".cancel").write_text("now")
        (rt.home.active / "busy" / "inbox" / "q.txt").write_text("hi")
        (rt.home.active / "asleep" / "inbox" / "q.txt").write_text("hi")
        (rt.home.active / ".hidden").mkdir()
        (rt.home.active / "notes.txt").write_text("not a conversation")
        gate = asyncio.Event()
        script.plan("busy", Step(gate=gate))
        d.poke("busy")
        assert await script.next_call() == "busy"
        d.timers["asleep"] = asyncio.get_running_loop().call_later(3600, lambda: None)

        poked = await d.rescan()

        expected = {"fresh", "grown", "inbox", "processing", "cancel"}
        assert poked == len(expected)
        await within(asyncio.gather(*(d.tasks[n] for n in expected)), "the poked runs")
        assert sorted(script.ids()) == sorted(["busy", *expected])
        assert d.dirty == set()  # the running one was left alone, not marked
        gate.set()
        await within(d.tasks["busy"], "busy")
        d.timers.pop("asleep").cancel()

    asyncio.run(scenario())


def test_rescan_of_a_missing_home_pokes_nothing_and_does_not_raise(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        assert not rt.home.active.exists()
        assert await d.rescan() == 0
        assert d.tasks == {}

    asyncio.run(scenario())


class HeldScan:
    """Stands in for ``signs_of_work``: counts the scans and holds each one on a thread event
    until the test lets it go (a scan run on the loop would hold the loop, and the test)."""

    def __init__(self) -> None:
        self.real = dispatcher_mod.signs_of_work
        self.started = threading.Semaphore(0)
        self.go = threading.Event()
        self.threads: list[int] = []

    def __call__(self, active: str, known: Mapping[str, int], skip: Set[str]) -> list[str]:
        self.threads.append(threading.get_ident())
        self.started.release()
        if not self.go.wait(10):
            raise AssertionError("the held scan was never let go")
        return self.real(active, known, skip)

    async def wait_started(self) -> None:
        await within(asyncio.to_thread(self.started.acquire, timeout=5), "a scan to start")


def test_a_rescan_runs_off_the_loop_while_turns_go_on(
    make_settings: Callable[..., Settings], script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan of every folder (~20 µs each: ~45 ms for 2,000) never holds the loop: a
    conversation poked while it runs is processed before the scan ends."""
    held = HeldScan()
    monkeypatch.setattr(dispatcher_mod, "signs_of_work", held)

    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        for name in ("quiet", "inbox"):
            conv_dir(rt, name, log=b"12345")
            d.seen.remember_size(Conv(rt.home.active / name))
        (rt.home.active / "inbox" / "inbox" / "q.txt").write_text("hi")
        scan = asyncio.create_task(d.rescan())
        await held.wait_started()
        d.poke("quiet")  # the loop is free: the run happens during the scan
        await within(d.tasks["quiet"], "a run during the scan")
        assert script.ids() == ["quiet"] and not scan.done()
        held.go.set()
        assert await within(scan, "the scan") == 1  # "inbox" only; "quiet" ran, is quiet
        await poll(lambda: "inbox" in script.ids(), "the poked run")
        assert held.threads and threading.get_ident() not in held.threads
        await d.drain(1.0)

    asyncio.run(scenario())


def test_rescans_asked_for_during_a_scan_come_to_one_more(
    make_settings: Callable[..., Settings], script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ticks and lost events never pile scans up: one runs at a time, and any number asked
    for meanwhile make exactly one more (what changed during the first is seen by it)."""
    held = HeldScan()
    monkeypatch.setattr(dispatcher_mod, "signs_of_work", held)

    async def scenario() -> None:
        rt = runtime(make_settings)
        rt.home.active.mkdir(parents=True)
        d = Dispatcher(rt)
        d.request_rescan()
        await held.wait_started()
        for _ in range(5):
            d.request_rescan()
        held.go.set()
        await held.wait_started()  # the one more
        assert d._scan is not None
        await within(d._scan, "the scans")
        assert len(held.threads) == 2
        d.request_rescan()
        assert d._scan is not None
        await within(d._scan, "a later scan")
        assert len(held.threads) == 3

    asyncio.run(scenario())


def test_drain_lets_go_of_a_scan_in_progress(
    make_settings: Callable[..., Settings], script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldScan()
    monkeypatch.setattr(dispatcher_mod, "signs_of_work", held)

    async def scenario() -> None:
        rt = runtime(make_settings)
        rt.home.active.mkdir(parents=True)
        conv_dir(rt, "waiting", log=b"")
        d = Dispatcher(rt)
        d.request_rescan()
        await held.wait_started()
        await within(d.drain(1.0), "drain during a scan")
        assert d._scan is not None and d._scan.cancelled()
        held.go.set()  # the thread's pass ends; nothing is poked after the drain
        d.request_rescan()
        assert d.tasks == {} and len(held.threads) == 1

    asyncio.run(scenario())


def test_drain_cancels_timers_and_ignores_new_pokes(
    make_settings: Callable[..., Settings], script: Script
) -> None:
    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        script.plan("c1", Step(wake_in=3600))
        d.poke("c1")
        await within(d.tasks["c1"], "the run")
        timer = d.timers["c1"]
        await within(d.drain(grace=1), "drain")
        assert timer.cancelled() and d.timers == {}
        d.poke("c2")
        assert d.tasks == {} and script.ids() == ["c1"]

    asyncio.run(scenario())


# --------------------------------------------------------------------------- real pipeline


def fake_conv(home: Home, topic: str) -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="m", backend="fake"
    )


def markers(conv: Conv) -> list[tuple[MarkerKind, str]]:
    return [m for b in parse(conv.log.read_bytes()).blocks for m in b.markers]


def test_a_dropped_message_is_answered_through_the_fake_backend(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    fake = install()
    fake.enqueue(Reply(chunks=("Hel", "lo"), thinking=("hmm",)))
    conv = fake_conv(home, "hello")
    drop_message(conv, "say hello")

    async def scenario() -> None:
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        d.poke(conv.id)
        await within(d.tasks[conv.id], "the turn")
        await rt.aclose()

    asyncio.run(scenario())
    (request,) = fake.requests
    assert request.model == "m" and request.conversation_id == conv.id
    assert request.messages[-1].role == "user" and request.messages[-1].content == "say hello"
    blocks = parse(conv.log.read_bytes()).blocks
    assert [b.text.strip() for b in blocks] == ["say hello", "Hello"]
    assert blocks[-1].thinking.strip() == "hmm"
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.turns == 1
    assert fake.finished == 1 and fake.closed


def test_cancel_during_a_reply_stops_the_stream_and_marks_the_turn(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    fake = install()
    conv = fake_conv(home, "essay")
    drop_message(conv, "write a long essay")

    async def scenario() -> None:
        gate = asyncio.Event()  # never set: the reply would never end on its own
        fake.enqueue(Reply(chunks=("first words ", "never sent"), gate=gate, gate_after=1))
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        d.poke(conv.id)
        task = d.tasks[conv.id]
        await fake.wait_for_requests(1)
        await poll(lambda: b"first words" in conv.log.read_bytes(), "the reply to start")
        request_cancel(conv)
        d.poke(conv.id)
        await within(task, "the cancelled task to end")
        assert not task.cancelled()  # the cancel was handled, not left to kill the task
        assert conv.id not in d.seen.cancelled
        await rt.aclose()

    asyncio.run(scenario())
    assert fake.interrupted == 1 and fake.finished == 0 and fake.active == 0
    assert (MarkerKind.CANCELLED, "generation stopped by the agent") in markers(conv)
    assert "never sent" not in conv.log.read_text()
    st = read_state(conv)
    assert st is not None and st.status is Status.CANCELLED
    assert not (conv.dir / ".cancel").exists()


def test_cancel_of_a_turn_queued_for_a_slot_writes_the_cancelled_marker_next_step(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """The turn is waiting for the backend's one slot (another conversation holds it): the
    task is cancelled there, and the dispatcher's next step writes the CANCELLED marker."""
    fake: FakeBackend = install()
    holder, queued = fake_conv(home, "holder"), fake_conv(home, "queued")
    drop_message(holder, "first")
    drop_message(queued, "second")

    async def scenario() -> None:
        gate = asyncio.Event()
        fake.enqueue(Reply(chunks=("held",), gate=gate))
        rt = runtime(make_settings)
        d = Dispatcher(rt)
        d.poke(holder.id)
        await fake.wait_for_requests(1)
        d.poke(queued.id)
        sched = rt.provider("fake").scheduler
        await poll(lambda: sched.waiting == 1, "the second turn to queue for the slot")
        request_cancel(queued)
        d.poke(queued.id)
        await within(d.tasks[queued.id], "the cancelled task")
        assert sched.running == 1
        assert len(fake.requests) == 1  # the cancelled turn never reached the server
        gate.set()
        await within(d.tasks[holder.id], "the holder's turn")
        assert (sched.running, sched.waiting) == (0, 0)
        await rt.aclose()

    asyncio.run(scenario())
    assert (MarkerKind.CANCELLED, "the turn was cancelled by the agent") in markers(queued)
    st = read_state(queued)
    assert st is not None and st.status is Status.CANCELLED
    assert not (queued.dir / ".cancel").exists()
    assert parse(holder.log.read_bytes()).blocks[-1].text.strip() == "held"
    assert [r.conversation_id for r in fake.requests] == [holder.id]


def test_a_transient_failure_sleeps_on_a_timer_and_the_retry_is_answered(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """The turn fails with a transient error: process() returns the retry time, the
    dispatcher turns it into a timer, and the timer's poke runs the retry."""
    fake = install()
    conv = fake_conv(home, "flaky")
    drop_message(conv, "are you there?")
    down = BackendError("cannot reach the server", transient=True, kind=ErrorKind.UNREACHABLE)

    async def scenario() -> None:
        second = asyncio.Event()
        fake.enqueue(Reply(chunks=("half",), error=down), Reply(chunks=("back",), gate=second))
        s = make_settings(retry={"base": 0.6, "cap": 0.6})  # the retry comes 0.3 to 0.6 s later
        rt = Runtime(settings=s, home=Home(s.home))
        d = Dispatcher(rt)
        d.poke(conv.id)
        first = d.tasks[conv.id]
        await within(first, "the failed turn")
        assert conv.id in d.timers and conv.id not in d.tasks
        st = read_state(conv)
        assert st is not None and st.status is Status.RETRYING and st.next_retry_at
        await fake.wait_for_requests(2)  # nobody poked: the timer did
        assert conv.id not in d.timers
        second.set()
        await within(d.tasks[conv.id], "the retried turn")
        assert d.timers == {}
        await rt.aclose()

    asyncio.run(scenario())
    assert [r.messages[-1].content for r in fake.requests] == ["are you there?"] * 2
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].text.strip() == "back"
    assert any(k is MarkerKind.INTERRUPTED for b in blocks for k, _ in b.markers)
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.retry_count == 0
