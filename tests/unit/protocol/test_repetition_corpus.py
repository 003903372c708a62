"""The loop watch never throws an honest answer away (honest repetition stopped as a loop):
over a corpus of real structured answers that repeat exactly (tests/repetition_corpus.py) it
stops none, and it still stops every loop of the corpus, prose loops as early as before."""

from __future__ import annotations

import random

import pytest

from contemplation.protocol import repetition
from contemplation.protocol.repetition import ReplyWatch, Watch
from tests import repetition_corpus as corpus


def cut_at(text: str, watch: Watch | None = None, seed: int = 0) -> int | None:
    """Where ``text``, fed as a model streams it (pieces of 1 to 12 characters), is cut."""
    rng = random.Random(seed)
    w = watch or Watch()
    i = 0
    while i < len(text):
        n = rng.randint(1, 12)
        if w.feed(text[i : i + n]) is not None:
            return i + n
        i += n
    return None


HONEST = corpus.honest()


@pytest.mark.parametrize("name", sorted(HONEST))
def test_an_honest_answer_of_the_corpus_is_not_stopped(name: str) -> None:
    assert cut_at(HONEST[name]) is None, name


def test_the_corpus_has_no_false_positive_and_the_old_rules_had_many() -> None:
    """0 of the corpus stopped; the rules before (every span 600 characters, 3 times) stopped
    most of it: the corpus is made of what they took for loops."""
    stopped = [n for n, t in HONEST.items() if cut_at(t) is not None]
    assert stopped == []
    before = [n for n, t in HONEST.items() if cut_at(t, Watch(**repetition.BEFORE)) is not None]
    assert len(before) >= 18, before
    assert "json array of 60 identical records" in before


@pytest.mark.parametrize("loop", corpus.loops(), ids=lambda lp: lp.name)
def test_every_loop_of_the_corpus_is_stopped(loop: corpus.Looping) -> None:
    at = cut_at(loop.text)
    assert at is not None, loop.name
    into = at - len(loop.start)
    assert into > 0  # the honest start is never cut
    old = cut_at(loop.text, Watch(**repetition.BEFORE))
    assert old is not None
    if repetition.shape(loop.span) == "prose":  # as early as before (one look's difference)
        assert at <= old + repetition.EVERY + 12, (at, old)
        assert into <= repetition.MIN_CHARS + 3 * len(loop.span) + repetition.EVERY + 12
    else:  # data: later, bounded
        assert into <= repetition.DATA_CHARS + 2 * len(loop.span) + repetition.EVERY + 12


SMOLLM2 = corpus.smollm2()


@pytest.mark.parametrize("name", sorted(SMOLLM2["loops"]))
def test_smollm2s_recorded_loops_are_stopped_where_they_were(name: str) -> None:
    """SmolLM2-135M's own loops at temperature 0 (recorded from llama.cpp): stopped at the
    same character as by the rules before."""
    text = SMOLLM2["loops"][name]
    at = cut_at(text)
    assert at is not None and at == cut_at(text, Watch(**repetition.BEFORE)), name
    assert at < len(text) // 2  # long before its reply's end


@pytest.mark.parametrize("name", sorted(SMOLLM2["runs"]))
def test_smollm2s_runs_of_one_emoji_or_shout_are_prose(name: str) -> None:
    """Its runs of 🍍, 🐦 and fullwidth exclamation marks, too short to stop in the recording,
    are stopped after 600 characters as any loop of words, not after 8,192 as data."""
    text = SMOLLM2["runs"][name]
    last = text.rstrip()[-1]
    assert text.rstrip().endswith(last * 40)
    assert repetition.shape(last) == "prose"
    assert cut_at(text + last * 700) is not None


@pytest.mark.parametrize(
    ("span", "kind"),
    [
        (" and a data warehouse", "prose"),
        ("Yes!\n", "prose"),
        ("!", "prose"),
        ("\U0001f34d", "prose"),
        ("一个数据仓库和", "prose"),
        ("I'm sorry, I can't help with that. ", "prose"),
        ("0, ", "data"),
        ("A", "data"),
        ("A" * 76 + "\n", "data"),
        ("-", "data"),
        ("\u2500", "data"),
        ("\n", "data"),
        (". ", "data"),
        ("| x | y |\n", "data"),
        ('  {"id": 0},\n', "data"),
        ("    assert not flags.pop()\n", "data"),
    ],
)
def test_the_shape_of_a_span(span: str, kind: str) -> None:
    assert repetition.shape(span) == kind
    assert all(repetition.shape(span[i:] + span[:i]) == kind for i in range(len(span)))


def test_a_reply_held_to_a_schema_is_not_watched_its_thinking_is() -> None:
    """A structured answer is bounded by the reply cap, not by repetition."""
    watch = ReplyWatch(schema=True)
    text = " and a data warehouse" * 400
    assert all(watch.feed("content", text[i : i + 7]) is None for i in range(0, len(text), 7))
    found = None
    for i in range(0, len(text), 7):
        found = found or watch.feed("thinking", text[i : i + 7])
    assert found is not None


def test_continue_is_not_cut_again_for_the_same_repetition() -> None:
    """The reply goes on (``continue``) from a text that was cut for repeating: the same
    repetition (any rotation of it) is not cut again; another loop is."""
    loop = " and a data warehouse"
    said = "In one sentence: Contemplation is" + loop * 40  # what the cut reply kept
    watch = ReplyWatch(carried=said)
    more = " data warehouse and a" * 300  # the same span, begun elsewhere in it
    assert all(watch.feed("content", more[i : i + 5]) is None for i in range(0, len(more), 5))
    other = "I hope this helps! " * 200
    found = None
    for i in range(0, len(other), 5):
        found = found or watch.feed("content", other[i : i + 5])
    assert found is not None and "I hope this helps" in found.span * 2
    # what is carried on without a loop at its end excuses nothing
    plain = ReplyWatch(carried="Here is the list of the things to do:\n")
    assert any(plain.feed("content", loop * 10) for _ in range(60))
