"""Pure: a reply stuck in a loop, seen as it streams (issue 45, finding 1).

A small model at temperature 0 can fall into a loop ("a data warehouse and a data warehouse
and …") and run to the end of its window. :class:`Watch` is fed the reply's text as it
arrives and says when its tail has become one span repeated over and over: the tail of at
least ``min_chars`` characters, and at least ``min_repeats`` periods, is *exactly* periodic
with a period of at most ``max_period`` characters.

Exact repetition only, on purpose: honest long text repeats its *shape* (numbered lists,
markdown tables, CSV rows, code, a poem's refrain between its verses) but not a long span
character for character, back to back. A degenerate loop does. The price: a loop that
changes a little each time (a counter in it) is not seen; the reply cap
(:func:`contemplation.engine.turn` sends one by default) bounds it instead.

Cost: a look every ``every`` new characters, each a few ``str.rfind`` over at most
``max_period`` characters and one comparison of at most ``min_repeats * max_period`` (all
in C); the text kept is at most ``2 * window`` characters. bench/bench_repetition.py measures
the cost per streamed token.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_CHARS = 600  # the repeating tail's least length (~130 tokens of English)
MIN_REPEATS = 3  # and its least number of periods (a long period repeated 3 times)
MAX_PERIOD = 2048  # the longest span looked for
EVERY = 32  # characters between two looks
PROBE = 16  # the tail's characters looked for further back (the candidates for a period)
CANDIDATES = 4  # periods tried per look, shortest first
SHOWN = 60  # characters of the span a message shows


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


class Watch:
    """Fed a reply's text piece by piece (:meth:`feed`); the first :class:`Loop` it sees."""

    def __init__(
        self,
        *,
        min_chars: int = MIN_CHARS,
        min_repeats: int = MIN_REPEATS,
        max_period: int = MAX_PERIOD,
        every: int = EVERY,
    ) -> None:
        if min_chars < PROBE or min_repeats < 2 or max_period < 1 or every < 1:
            raise ValueError("min_chars >= 16, min_repeats >= 2, max_period >= 1, every >= 1")
        self.min_chars = min_chars
        self.min_repeats = min_repeats
        self.max_period = max_period
        self.every = every
        self._window = max(min_chars, min_repeats * max_period) + PROBE
        self._text = ""
        self._since = 0  # characters since the last look
        self.found: Loop | None = None

    def feed(self, text: str) -> Loop | None:
        """Take the next piece of the reply; the loop once one is seen (and from then on)."""
        if self.found is not None or not text:
            return self.found
        self._text += text
        if len(self._text) > 2 * self._window:  # bounded: the tail is all a look needs
            self._text = self._text[-self._window :]
        self._since += len(text)
        if self._since >= self.every:
            self._since = 0
            self.found = self._look()
        return self.found

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
            length = max(self.min_chars, self.min_repeats * p)
            if length <= n and s[n - length : n - p] == s[n - length + p :]:
                return Loop(span=s[n - p :], period=p, repeats=self._run(p) // p)
            end = pos + PROBE - 1  # the next candidate starts before this one
        return None

    def _run(self, p: int) -> int:
        """How far back from the end the text is ``p``-periodic (within what is kept)."""
        s, n = self._text, len(self._text)
        length = max(self.min_chars, self.min_repeats * p)
        while length + p <= n and s[n - length - p : n - length] == s[n - length : n - length + p]:
            length += p
        return length


class ReplyWatch:
    """A reply's answer and its thinking, each watched apart (a switch from one to the other
    is no repetition, and a loop in either is one)."""

    def __init__(self) -> None:
        self._by = {"content": Watch(), "thinking": Watch()}

    def feed(self, kind: str, text: str) -> Loop | None:
        w = self._by.get(kind)
        return w.feed(text) if w is not None and text else None
