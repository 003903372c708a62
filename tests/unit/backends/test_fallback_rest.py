"""A fallback chain's dead primary rests (review: every turn paid its connect timeout again).

A backend found unreachable is passed over for a doubling rest (REST_FIRST up to REST_MAX),
tried again when it is over, and forgiven by its first answer; each skip and each try again
is a log line. The clock is handed in, so the rests are exact and nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from contemplation.backends import fallback
from contemplation.backends.fallback import FallbackBackend
from contemplation.errors import BackendError
from contemplation.models import StreamEvent
from tests.unit.backends.test_capabilities import DOWN, REQ, _Scripted


@pytest.fixture(autouse=True)
def default_structlog() -> Iterator[None]:
    """structlog as it starts: an earlier test that ran the CLI in this process configured it
    (a level filter, loggers cached on first use), which capture_logs does not undo — this
    file failed so after tests/system/test_cli_commands.py. Put back afterwards."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def turn(fb: FallbackBackend) -> list[StreamEvent]:
    async def go() -> list[StreamEvent]:
        return [ev async for ev in fb.stream(REQ)]

    return asyncio.run(go())


def test_a_dead_primary_rests_doubling_and_is_forgiven_by_an_answer() -> None:
    clock = Clock()
    primary, second = _Scripted("ollama", error=DOWN), _Scripted("local", text="hi")
    fb = FallbackBackend([primary, second], clock=clock)
    turn(fb)
    assert (primary.calls, second.calls) == (1, 1)
    with capture_logs() as logs:
        events = turn(fb)  # within its rest: not asked at all
    assert (primary.calls, second.calls) == (1, 2)
    assert events[0].kind == "note" and events[0].text.startswith("ollama unreachable ("), events
    assert "; passed over, tried again in 4 s)" in events[0].text, events
    assert events[0].text.endswith("this reply comes from local")
    [skip] = [e for e in logs if e["event"] == "fallback_skipped"]
    assert skip["backend"] == "ollama" and skip["for_s"] == fallback.REST_FIRST
    clock.now += fallback.REST_FIRST  # the rest is over: tried again, still down
    with capture_logs() as logs:
        turn(fb)
    assert primary.calls == 2
    assert [e["backend"] for e in logs if e["event"] == "fallback_tried_again"] == ["ollama"]
    clock.now += fallback.REST_FIRST  # the rest doubled: still passed over
    turn(fb)
    assert primary.calls == 2
    clock.now += fallback.REST_FIRST
    primary.error = None  # back: its answer ends the rests
    primary.text = "from ollama"
    events = turn(fb)
    assert primary.calls == 3 and [e.text for e in events if e.kind == "content"] == ["from ollama"]
    primary.error = DOWN
    turn(fb)
    clock.now += fallback.REST_FIRST  # the first rest again, not a doubled one
    turn(fb)
    assert primary.calls == 5


def test_the_rest_is_bounded() -> None:
    clock = Clock()
    primary = _Scripted("ollama", error=DOWN)
    fb = FallbackBackend([primary, _Scripted("local", text="hi")], clock=clock)
    for _ in range(20):  # far more doublings than REST_MAX allows
        turn(fb)
        clock.now += fallback.REST_MAX
    assert primary.calls == 20


def test_when_all_rest_they_are_still_tried_in_order() -> None:
    """Resting moves a backend to the end of the chain, never out of it: with every one
    down the turn still asks them all before it fails."""
    clock = Clock()
    a, b = _Scripted("a", error=DOWN), _Scripted("b", error=DOWN)
    fb = FallbackBackend([a, b], clock=clock)
    for _ in range(2):
        with pytest.raises(BackendError, match="unreachable"):
            turn(fb)
    assert (a.calls, b.calls) == (2, 2)
