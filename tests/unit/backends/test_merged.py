"""Merged: the text events of one read of a stream go on as one event each run."""

from __future__ import annotations

from contemplation.backends.base import Merged
from contemplation.models import StreamEvent, Usage


def _ev(kind: str, text: str = "") -> StreamEvent:
    return StreamEvent(kind, text=text)  # type: ignore[arg-type]


def test_a_run_of_tokens_becomes_one_event_and_nothing_is_lost_or_reordered() -> None:
    m = Merged()
    out = m.add([_ev("content", "a"), _ev("content", "b"), _ev("thinking", "t1")])
    assert [(e.kind, e.text) for e in out] == [("content", "ab")]
    done = StreamEvent("done", usage=Usage())
    out = m.add([_ev("thinking", "t2"), _ev("content", "c"), done])
    assert [(e.kind, e.text) for e in out] == [("thinking", "t1t2"), ("content", "c"), ("done", "")]
    assert out[-1] is done
    assert m.flush() == []


def test_what_is_held_comes_out_at_flush() -> None:
    m = Merged()
    assert m.add([_ev("content", "x"), _ev("content", "y")]) == []
    assert [(e.kind, e.text) for e in m.flush()] == [("content", "xy")]
    assert m.flush() == []


def test_a_flood_still_goes_out_in_pieces_of_the_limit() -> None:
    m = Merged()
    token = "w" * 1000
    out = m.add([_ev("content", token)] * 200)  # 200,000 characters in one read
    out += m.flush()
    assert "".join(e.text for e in out) == token * 200
    assert len(out) > 1
    assert all(len(e.text) <= Merged.LIMIT + len(token) for e in out)


def test_take_holds_a_run_only_while_more_of_the_read_is_buffered() -> None:
    m = Merged()
    assert m.take([_ev("content", "a")], more=True) == []
    out = m.take([_ev("content", "b")], more=False)
    assert [(e.kind, e.text) for e in out] == [("content", "ab")]
