"""A wall clock stepped backwards (NTP after a bad RTC, a person fixing the date) never makes a
retrying conversation wait for the step (it waited a day). Backoffs and
breaker rests are measured on the monotonic clock; state.json keeps wall times, and one read
back after a restart that lies further off than any backoff the daemon sets is clamped.

The clocks are injected (the runtime's ``clock`` and ``steady``): nothing sleeps. The turns
run the real pipeline against the fake Ollama server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from contemplation.engine.breaker import Breaker
from contemplation.engine.pipeline import process
from contemplation.engine.runtime import Runtime
from contemplation.engine.tracking import Tracked
from contemplation.models import BlockKind, Status
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.fakes.ollama_server import FakeOllama, Step

DAY = 86400.0
RETRY = {"base": 5.0, "cap": 10.0}  # the first retry comes 2.5 to 5 s later


class Clocks:
    """A wall clock and a monotonic one, moved by hand."""

    def __init__(self) -> None:
        self.wall = time.time() + 10 * DAY  # ahead of every file's mtime: all settled
        self.mono = 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def pass_(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def step_wall(self, seconds: float) -> None:
        self.wall += seconds


def asking(home: Home, fake: FakeOllama) -> Conv:
    """A conversation with one message whose first try fails (a 503), the second answers."""
    conv = new_conversation(
        home, "steps", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    drop_message(conv, "ping")
    fake.enqueue(Step(kind="error", status=503, error="busy"), Step(text="pong"))
    return conv


def replies(conv: Conv) -> list[str]:
    return [
        b.text
        for b in parse(conv.log.read_bytes()).blocks
        if b.kind is BlockKind.MODEL and not b.interrupted
    ]


def run(rt: Runtime, conv: Conv) -> float | None:
    """One look at the conversation, as the daemon's timer makes it."""

    async def once() -> float | None:
        try:
            return await process(conv, rt, Tracked())
        finally:
            await rt.aclose()

    return asyncio.run(once())


def runtime(settings: Settings, home: Home, clocks: Clocks) -> Runtime:
    return Runtime(settings=settings, home=home, clock=clocks.time, steady=clocks.monotonic)


def failed_once(
    home: Home, fake: FakeOllama, make_settings: Callable[..., Settings], clocks: Clocks
) -> tuple[Runtime, Conv, float]:
    settings = make_settings(fake, retry=RETRY)
    rt = runtime(settings, home, clocks)
    conv = asking(home, fake)
    wake = run(rt, conv)
    st = read_state(conv)
    assert st is not None and st.status is Status.RETRYING and wake is not None
    delay = wake - clocks.wall
    assert 2.5 <= delay <= 5.0, delay
    assert len(fake.chat_requests()) == 1
    return rt, conv, delay


def test_a_backwards_step_during_a_backoff_does_not_lengthen_it(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    clocks = Clocks()
    rt, conv, delay = failed_once(home, fake_ollama, make_settings, clocks)
    clocks.step_wall(-DAY)
    clocks.pass_(delay / 2)  # the timer fires early: what is left is asked for, not a day
    wake = run(rt, conv)
    assert wake is not None and abs(wake - clocks.wall - delay / 2) < 0.01, wake - clocks.wall
    assert len(fake_ollama.chat_requests()) == 1
    clocks.pass_(delay / 2)  # the backoff is over on the monotonic clock
    run(rt, conv)
    assert len(fake_ollama.chat_requests()) == 2
    assert replies(conv) == ["pong"]
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.next_retry_at is None


def test_a_retry_time_read_back_after_a_restart_is_clamped_to_the_longest_backoff(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """The daemon stopped while a retry waited, the clock was stepped back a day, a new one
    started: the retry time in state.json lies a day off. It is clamped to the longest wait
    the daemon ever sets (a server's Retry-After cap, an hour), not waited for."""
    clocks = Clocks()
    _, conv, _ = failed_once(home, fake_ollama, make_settings, clocks)
    clocks.step_wall(-DAY)
    rt = runtime(make_settings(fake_ollama, retry=RETRY), home, clocks)  # a fresh daemon
    wake = run(rt, conv)
    assert wake is not None
    assert wake - clocks.wall <= 3600.0, wake - clocks.wall
    assert len(fake_ollama.chat_requests()) == 1
    clocks.pass_(wake - clocks.wall)
    run(rt, conv)
    assert replies(conv) == ["pong"]


def test_a_breaker_rests_on_the_monotonic_clock() -> None:
    """Its rest is a duration: a wall clock stepped back does not lengthen it, and the times
    it answers are wall times (what state.json and the faces show)."""
    clocks = Clocks()
    b = Breaker(threshold=1, cooldown=10.0, clock=clocks.time, steady=clocks.monotonic)
    b.failure()
    assert b.resting() == clocks.wall + 10.0 and not b.allow()
    clocks.step_wall(-DAY)
    assert b.resting() == clocks.wall + 10.0  # still 10 s, in the stepped clock's terms
    clocks.pass_(10.0)
    assert b.resting() is None and b.allow()  # the probe
    b.success()
    b.trip(clocks.wall + 30.0)  # a server's Retry-After, said in wall time
    clocks.step_wall(-DAY)
    assert b.resting() == clocks.wall + 30.0
    clocks.pass_(30.0)
    assert b.allow()


SETTLE = 1.0


def test_a_file_written_in_place_before_the_clock_steps_back_is_taken_once_it_settled(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """A message written in place into inbox/ (no rename: it waits to settle), then the wall
    clock steps back 40 s: the file's mtime lies 40 s ahead of the clock, and its age was
    read from the two ("queued" for 40 s and more). It is taken once it has been seen
    unchanged for settle_seconds on the monotonic clock."""
    clocks = Clocks()
    clocks.wall = time.time()  # the file's mtime is now
    rt = runtime(make_settings(fake_ollama, settle_seconds=SETTLE), home, clocks)
    conv = new_conversation(
        home, "steps", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    fake_ollama.enqueue(Step(text="pong"))
    (conv.inbox / "note.txt").write_text("ping")
    clocks.step_wall(-40)
    seen = Tracked()
    wake = look(rt, conv, seen)
    assert wake is not None and wake - clocks.wall <= SETTLE + 0.01, wake - clocks.wall
    assert fake_ollama.chat_requests() == []  # not settled yet: seen once, just now
    clocks.pass_(SETTLE)
    look(rt, conv, seen)
    assert replies(conv) == ["pong"]
    assert len(fake_ollama.chat_requests()) == 1


def look(rt: Runtime, conv: Conv, seen: Tracked) -> float | None:
    """One look at the conversation by a daemon that keeps what it saw between looks."""

    async def once() -> float | None:
        try:
            return await process(conv, rt, seen)
        finally:
            await rt.aclose()

    return asyncio.run(once())
