"""Pure: a reply stuck in a loop, seen as it streams, and an honest answer that repeats
never taken for one.

A small model at temperature 0 can fall into a loop ("a data warehouse and a data warehouse
and …") and run to the end of its window. :class:`Watch` is fed the reply's text as it
arrives and says when its tail has become one span repeated over and over, *exactly*, back to
back, with a period of at most ``max_period`` characters, for long enough:

- a span of words (:func:`shape` ``prose``): a tail of ``min_chars`` (600) characters and
  ``min_repeats`` (3) periods. Honest prose repeats its shape (numbered lists, a refrain
  between its verses), not a long run of words character for character; a loop does.
- a span of data (``data``: digits, markup, rules, base64, whitespace): a tail of
  ``data_chars`` (8,192) characters and ``data_repeats`` (64) periods (at most
  :data:`DATA_SPAN`). An honest answer does repeat such a span exactly and correctly: a JSON
  array of identical records, a table of identical rows, CSV of zeros, a zero matrix, base64
  of zero bytes, a separator line, repeated ``assert`` lines. Short periods need many repeats
  (8,192 characters: 2,730 of ``0, ``) and long ones 64. A model stuck printing the same
  record is still stopped, later; the reply cap bounds it before that in small windows.

tests/repetition_corpus.py holds honest answers of every such shape (none is stopped) and the
loops (all are, prose ones as early as before). The turn (:mod:`contemplation.engine.turn.
stream`) does not watch an answer held to a schema (:class:`ReplyWatch` ``schema``): its shape
is asked for, and the reply cap bounds it; and a reply carried on (``continue``) is not
stopped again for the repetition its carried text ends with (``carried``).

Exact repetition only, on purpose: a loop that changes a little each time (a counter in it)
is not seen; the reply cap (:func:`contemplation.engine.turn` sends one by default) bounds it.

Cost: a look every ``every`` new characters, each a few ``str.rfind`` over at most
``max_period`` characters and comparisons of at most :data:`DATA_SPAN` characters (all in
C); the text kept is at most ``window + SLACK`` characters. bench/bench_repetition.py measures
the cost per streamed token, the false positives over the corpus and the characters a loop
runs before it is stopped, with the rules before (:data:`BEFORE`) and now.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Literal, TypedDict

MIN_CHARS = 600  # a span of words: the repeating tail's least length (~130 tokens of English)
MIN_REPEATS = 3  # and its least number of periods (a long period repeated 3 times)
DATA_CHARS = 8192  # a span of data: the repeating tail's least length
DATA_REPEATS = 64  # and its least number of periods
DATA_SPAN = 32768  # the most a span of data needs (a long period: fewer than 64 repeats)
MAX_PERIOD = 2048  # the longest span looked for
EVERY = 32  # characters between two looks
PROBE = 16  # the tail's characters looked for further back (the candidates for a period)
CANDIDATES = 4  # periods tried per look, shortest first
SHOWN = 60  # characters of the span a message shows
SLACK = 4096  # characters kept past the window before it is trimmed
LONG_WORD = 30  # a run of letters at least this long is no word (base64, a sequence)
#: characters of data and markup, rare in prose: a span with one is data
MARKS = frozenset('{}[]()<>|="`:;_#/\\~^@\t')
#: a span of these (or emoji) alone is a model shouting, not data (SmolLM2 ends in U+FF01s)
SHOUTS = frozenset("!?\u00a1\u00bf\uff01\uff1f")


class Rules(TypedDict):
    data_chars: int
    data_repeats: int


#: the rules before honest repetition was told from a loop: every span as a span of words
BEFORE: Rules = {"data_chars": MIN_CHARS, "data_repeats": MIN_REPEATS}

Shape = Literal["prose", "data"]


@dataclass(frozen=True, slots=True)
class Loop:
    """What was found: the span that repeats (one period), its length and how many times at
    least it repeated back to back at the end of the text."""

    span: str
    period: int
    repeats: int

    def describe(self) -> str:
        """A line for a person: the span (cut, on one line) and how often it came."""
        shown = self.span if len(self.span) <= SHOWN else self.span[:SHOWN] + "…"
        shown = shown.replace("\n", "\\n")
        return f"«{shown}» ({self.period} characters) {self.repeats} times in a row"


def shape(span: str) -> Shape:
    """``prose`` for a span of words (or of ``!``, ``?`` and emoji: SmolLM2 loops on 🍍),
    ``data`` for anything an honest structured answer repeats: digits or markup in it, box
    drawing, no letters at all (whitespace, rules, dots), or letters in a run no word is as
    long as (base64's ``AAAA``, a DNA sequence). Rotations of a span have the same shape."""
    if any(c in MARKS or c.isdigit() or "\u2500" <= c <= "\u259f" for c in span):
        return "data"
    if not any(c.isalpha() for c in span):  # a model shouting, or whitespace, rules, dots
        shouts = any(c in SHOUTS or unicodedata.category(c) == "So" for c in span)
        return "prose" if shouts else "data"
    run = longest = 0
    for c in span + span:  # cyclic: the run that wraps around the period counts whole
        if c.isspace() or unicodedata.east_asian_width(c) in "WF":  # a CJK character: a word
            run = 0
        else:
            run += 1
            longest = max(longest, run)
    return "data" if longest >= min(LONG_WORD, 2 * len(span)) else "prose"


def root(span: str) -> str:
    """The shortest string ``span`` is a whole number of copies of."""
    n = len(span)
    for d in range(1, n + 1):
        if n % d == 0 and span[:d] * (n // d) == span:
            return span[:d]
    return span


class Watch:
    """Fed a reply's text piece by piece (:meth:`feed`); the first :class:`Loop` it sees.
    A loop whose span is ``excused`` (or a rotation or multiple of it) is let go on."""

    def __init__(
        self,
        *,
        min_chars: int = MIN_CHARS,
        min_repeats: int = MIN_REPEATS,
        data_chars: int = DATA_CHARS,
        data_repeats: int = DATA_REPEATS,
        max_period: int = MAX_PERIOD,
        every: int = EVERY,
        excused: str = "",
    ) -> None:
        if min_chars < PROBE or min_repeats < 2 or max_period < 1 or every < 1:
            raise ValueError("min_chars >= 16, min_repeats >= 2, max_period >= 1, every >= 1")
        if data_chars < min_chars or data_repeats < min_repeats:
            raise ValueError("data_chars >= min_chars and data_repeats >= min_repeats")
        self.min_chars = min_chars
        self.min_repeats = min_repeats
        self.data_chars = data_chars
        self.data_repeats = data_repeats
        self.max_period = max_period
        self.every = every
        self._excused = root(excused) if excused else ""
        longest = max(min_chars, min_repeats * max_period, self._data_need(max_period))
        self._window = longest + PROBE
        self._text = ""
        self._pending: list[str] = []  # pieces fed since the last look
        self._since = 0  # characters since the last look
        self.found: Loop | None = None

    def feed(self, text: str) -> Loop | None:
        """Take the next piece of the reply; the loop once one is seen (and from then on)."""
        if self.found is not None or not text:
            return self.found
        self._pending.append(text)
        self._since += len(text)
        if self._since >= self.every:
            self._since = 0
            self._text += "".join(self._pending)
            self._pending.clear()
            if len(self._text) > self._window + SLACK:  # bounded: the tail is all a look needs
                self._text = self._text[-self._window :]
            self.found = self._look()
        return self.found

    def _data_need(self, p: int) -> int:
        return max(self.data_chars, min(self.data_repeats * p, DATA_SPAN))

    def _look(self) -> Loop | None:
        s = self._text
        n = len(s)
        if n < self.min_chars:
            return None
        probe = s[n - PROBE :]
        lowest = max(0, n - PROBE - self.max_period)  # a period of at most max_period
        end = n - 1  # an earlier occurrence of the probe: it ends before the text does
        for _ in range(CANDIDATES):
            pos = s.rfind(probe, lowest, end)
            if pos < 0:
                return None
            p = n - PROBE - pos
            end = pos + PROBE - 1  # the next candidate starts before this one
            if not self._periodic(p, max(self.min_chars, self.min_repeats * p)):
                continue
            span = s[n - p :]
            if shape(span) == "data" and not self._periodic(p, self._data_need(p)):
                continue
            if self._excused and self._is_excused(span):
                continue
            return Loop(span=span, period=p, repeats=self._run(p) // p)
        return None

    def _periodic(self, p: int, length: int) -> bool:
        """The last ``length`` characters kept repeat with period ``p``."""
        s, n = self._text, len(self._text)
        return length <= n and s[n - length : n - p] == s[n - length + p :]

    def _is_excused(self, span: str) -> bool:
        r, e = root(span), self._excused
        return len(r) == len(e) and r in e + e

    def _run(self, p: int) -> int:
        """How far back from the end the text is ``p``-periodic (within what is kept)."""
        s, n = self._text, len(self._text)
        length = max(self.min_chars, self.min_repeats * p)
        while length + p <= n and s[n - length - p : n - length] == s[n - length : n - length + p]:
            length += p
        return length


def carried_loop(text: str) -> str:
    """The span ``text`` ends repeating, as the rules before saw loops ("" when none): a
    reply carried on (``continue``) goes on past it, the agent having seen it."""
    found = Watch(**BEFORE).feed(text[-(MIN_REPEATS * MAX_PERIOD + PROBE) - MIN_CHARS :])
    return found.span if found is not None else ""


class ReplyWatch:
    """A reply's answer and its thinking, each watched apart (a switch from one to the other
    is no repetition, and a loop in either is one). An answer held to a ``schema`` is not
    watched (the reply cap bounds it); an answer that carries on the ``carried`` text
    (``continue``) is not stopped for the span that text ends repeating."""

    def __init__(self, *, schema: bool = False, carried: str = "") -> None:
        self._by: dict[str, Watch] = {"thinking": Watch()}
        if not schema:
            self._by["content"] = Watch(excused=carried_loop(carried) if carried else "")

    def feed(self, kind: str, text: str) -> Loop | None:
        w = self._by.get(kind)
        return w.feed(text) if w is not None and text else None
