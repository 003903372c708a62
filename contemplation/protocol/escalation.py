"""Pure: the escalation ladder, as configured and as the log records it.

An alias (``[aliases.small] escalate = [...]``) or a template (``escalate = [...]`` in its
template.toml) names the rungs after its own model: each a model on the same providers, an
alias (its providers and options come with it), a panel (``panel:qwen3:8b,gemma3``) or
``agent`` (last: the turn waits for the agent). When a reply fails for a named cause whose rule
is on, the reply stays in the log and one marker after it says why and where the turn goes::

    === ESCALATED: stopped repeating itself → qwen3:8b ===

The log is the ladder's only record: the rung a turn runs on is the one the last ``ESCALATED``
marker names (of this turn; with ``sticky``, of the whole log), so a daemon killed after the
marker redoes that rung, never the one before it nor the one after it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from contemplation.values import Block, BlockKind, MarkerKind

if TYPE_CHECKING:  # the book's models (pydantic) load where a book is written, not to read one
    from contemplation.models import LadderBook, LadderStep

AGENT = "agent"
PANEL = "panel:"
ALIAS = "alias:"  # an explicit alias rung: an unknown name is a configuration error
ARROW = " → "
MAX_RUNGS = 8  # rungs after the alias's own model
MAX_RUNG_CHARS = 200
MAX_SEATS = 8

Kind = Literal["model", "alias", "panel", "agent"]

#: the named causes, each a rule (``[escalation]``) and the words of its marker
CAUSES: dict[str, str] = {
    "loop": "stopped repeating itself",
    "length": "cut at the token limit after one continue",
    "schema": "did not match its schema after one retry",
    "needs": "hit the need-round limit",
    "error": "the backend failed after its retries",
    "time": "went over its time budget",
    "seat": "a seat of the panel failed",
    "disagree": "the panel's seats disagreed",
}
#: causes of a panel rung's own: any failure of one of its seats is ``seat``
PANEL_CAUSES = frozenset({"seat", "disagree"})
_WORDS = {words: cause for cause, words in CAUSES.items()}
_MARK_RE = re.compile(
    r"^(?P<why>.*?)(?: \((?P<detail>.*)\))?" + re.escape(ARROW) + r"(?P<to>\S.*)$"
)


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung: its name as written (and in the marker), what it is, the models it asks."""

    name: str
    kind: Kind
    models: tuple[str, ...] = ()

    @property
    def model(self) -> str:
        return self.models[0] if self.models else ""

    @property
    def seats(self) -> int:
        """The seats of a panel rung (0: not a panel)."""
        return len(self.models) if self.kind == "panel" else 0


@dataclass(frozen=True, slots=True)
class Ladder:
    """The rungs after the conversation's own model, and whether the rung that answers stays."""

    rungs: tuple[Rung, ...]
    sticky: bool = True
    owner: str = ""  # the alias or template it belongs to (for the words)

    def index(self, name: str) -> int | None:
        for i, r in enumerate(self.rungs):
            if r.name == name:
                return i
        return None

    def after(self, name: str | None) -> Rung | None:
        """The rung after ``name`` (None: the conversation's own model): None at the top."""
        if name is None:
            return self.rungs[0] if self.rungs else None
        i = self.index(name)
        if i is None or i + 1 >= len(self.rungs):
            return None
        return self.rungs[i + 1]


class LadderError(ValueError):
    """A ladder that cannot be used: the one line says which rung and why."""


def parse(
    entries: Sequence[object],
    *,
    aliases: Collection[str] | None = (),
    own: str = "",
    sticky: bool = True,
) -> Ladder:
    """The ladder ``entries`` spell (``own``: the alias or template they belong to, which no
    rung may name again). Raises :class:`LadderError` with one line."""
    if len(entries) > MAX_RUNGS:
        raise LadderError(f"{len(entries)} rungs; at most {MAX_RUNGS}")
    rungs: list[Rung] = []
    seen: set[str] = set()
    for n, raw in enumerate(entries, 1):
        if not isinstance(raw, str) or not raw.strip():
            raise LadderError(
                f"rung {n} is empty: each rung is a model, an alias, panel:A,B or agent"
            )
        name = raw.strip()
        if len(name) > MAX_RUNG_CHARS or any(c in name for c in "\n\r=") or ARROW.strip() in name:
            raise LadderError(f"rung {n} ({name[:40]!r}) is not a model name")
        rung = _rung(n, name, aliases)
        if rung.kind == "agent" and n != len(entries):
            raise LadderError(f"rung {n} is agent: the agent can only be the last rung")
        if name == own or (rung.kind == "alias" and rung.model == own):
            raise LadderError(f"rung {n} ({name!r}) is the ladder's own {own!r}: a cycle")
        if rung.name in seen:
            raise LadderError(f"rung {n} ({name!r}) is named twice: a cycle")
        seen.add(rung.name)
        rungs.append(rung)
    return Ladder(tuple(rungs), sticky=sticky, owner=own)


def _rung(n: int, name: str, aliases: Collection[str] | None) -> Rung:
    if name == AGENT:
        return Rung(name, "agent")
    if name.startswith(PANEL):
        return _panel(n, name, aliases)
    if name.startswith(ALIAS):
        alias = name[len(ALIAS) :].strip()
        if aliases is not None and alias not in aliases:
            raise LadderError(f"rung {n} ({name!r}): no alias named {alias!r}")
        return Rung(name, "alias", (alias,))
    if aliases is not None and name in aliases:
        return Rung(name, "alias", (name,))
    return Rung(name, "model", (name,))


def _panel(n: int, name: str, aliases: Collection[str] | None) -> Rung:
    """A panel rung: each seat a model or an alias (``alias:`` names one that must exist), no
    panel and no agent; its name written without spaces (the log's markers name it so)."""
    seats = [s.strip() for s in name[len(PANEL) :].split(",")]
    if len(seats) < 2 or not all(seats):
        raise LadderError(f"rung {n} ({name!r}): a panel is panel:MODEL,MODEL (two at least)")
    if len(seats) > MAX_SEATS:
        raise LadderError(f"rung {n} ({name!r}): at most {MAX_SEATS} seats")
    models: list[str] = []
    for k, written in enumerate(seats, 1):
        seat = written
        if seat.startswith(PANEL):
            raise LadderError(f"rung {n} ({name!r}): seat {k} is a panel; panels do not nest")
        if seat == AGENT:
            raise LadderError(f"rung {n} ({name!r}): seat {k} is the agent; a seat is a model")
        if any(c.isspace() for c in seat):
            raise LadderError(f"rung {n} ({name!r}): seat {k} ({seat!r}) is not a model name")
        if seat.startswith(ALIAS):
            seat = seat[len(ALIAS) :].strip()
            if aliases is not None and seat not in aliases:
                raise LadderError(f"rung {n} ({name!r}): seat {k} names no alias {seat!r}")
        models.append(seat)
    return Rung(PANEL + ",".join(seats), "panel", tuple(models))


# --------------------------------------------------------------------------- the log


def marker_text(cause: str, to: str, detail: str = "") -> str:
    """``stopped repeating itself → qwen3:8b`` (a detail in parentheses before the arrow)."""
    words = CAUSES.get(cause, cause)
    return f"{words} ({detail}){ARROW}{to}" if detail else f"{words}{ARROW}{to}"


@dataclass(frozen=True, slots=True)
class Step:
    """One ``ESCALATED`` marker read back: its cause (a key of :data:`CAUSES`, else the
    words), the rung it names and the index of its block."""

    cause: str
    to: str
    block: int


def read(text: str, block: int = -1) -> Step | None:
    m = _MARK_RE.match(text)
    if m is None:
        return None
    why = m.group("why").strip()
    return Step(_WORDS.get(why, why), m.group("to").strip(), block)


def steps(blocks: Sequence[Block], start: int = 0) -> list[Step]:
    """Every ``ESCALATED`` marker from block ``start`` on, oldest first."""
    out: list[Step] = []
    for i in range(start, len(blocks)):
        for kind, text in blocks[i].markers:
            if kind is MarkerKind.ESCALATED and (s := read(text, i)) is not None:
                out.append(s)
    return out


def turn_start(blocks: Sequence[Block]) -> int:
    """The index of the agent's own message that began the current turn (0: none)."""
    for i in range(len(blocks) - 1, -1, -1):
        b = blocks[i]
        if b.kind is BlockKind.AGENT and b.response_to is None:
            return i
    return 0


def current(blocks: Sequence[Block], *, sticky: bool) -> str | None:
    """The rung the turn due runs on (None: the conversation's own model): the one the last
    ``ESCALATED`` marker of this turn names; with ``sticky``, of the whole log (the agent's
    rung does not stay: the next message goes back to the rung before it)."""
    start = turn_start(blocks)
    this_turn = steps(blocks, start)
    if this_turn:
        return this_turn[-1].to
    if not sticky:
        return None
    for s in reversed(steps(blocks, 0)):
        if s.to != AGENT:
            return s.to
    return None


def rung_of(block: Block) -> str | None:
    """The rung a model block's reply was asked on, from the NOTE the ladder writes on it."""
    for kind, text in block.markers:
        if kind is MarkerKind.NOTE and text.startswith(ANSWERED_BY):
            return text[len(ANSWERED_BY) :].split(" ", 1)[0]
    return None


ANSWERED_BY = "answered on the escalation ladder's rung "


def answered_note(rung: str, cause: str, ladder_owner: str, seat: Seat | None = None) -> str:
    """The NOTE on a reply a rung above the conversation's own model wrote (on a panel rung's
    seat: which seat, ``seat 1 of 2, qwen3:8b``)."""
    of = f" of {ladder_owner}" if ladder_owner else ""
    why = f"escalated: {CAUSES.get(cause, cause)}" if cause else "kept from an earlier turn"
    sat = f"seat {seat.k} of {seat.n}, {seat.model}; " if seat is not None else ""
    return f"{ANSWERED_BY}{rung}{of} ({sat}{why})"


# --------------------------------------------------------------------------- a panel rung
#
# A panel rung's seats answer the turn one after another, each a reply of its own under the
# conversation's header, its NOTE naming the rung and the seat. The log alone says how far the
# panel got: the seats of the rung that answered since the agent's message. The turn is due
# until every seat has answered; the last seat's reply carries the verdict (a NOTE that they
# agree, or the ESCALATED marker of a disagreement).

_SEAT_RE = re.compile(r"\(seat (\d+) of (\d+), (\S+); ")
AGREED = "the panel's seats agree: "
RULE = "compared without case, spacing and punctuation; JSON by its value"


@dataclass(frozen=True, slots=True)
class Seat:
    """One seat of a panel rung: the rung, its place (``k`` of ``n``, from 1) and its model."""

    rung: str
    k: int
    n: int
    model: str = ""


def seat_of(block: Block) -> Seat | None:
    """The panel rung's seat whose reply ``block`` is, from its NOTE (None: not a seat's)."""
    for kind, text in block.markers:
        if kind is MarkerKind.NOTE and text.startswith(ANSWERED_BY):
            rest = text[len(ANSWERED_BY) :]
            rung = rest.split(" ", 1)[0]
            m = _SEAT_RE.search(rest)
            if m is not None and rung.startswith(PANEL):
                return Seat(rung, int(m.group(1)), int(m.group(2)), m.group(3))
    return None


def seats_answered(blocks: Sequence[Block], rung: str, start: int = 0) -> dict[int, int]:
    """The seats of ``rung`` that answered from block ``start`` on: seat number → its block."""
    out: dict[int, int] = {}
    for i in range(start, len(blocks)):
        s = seat_of(blocks[i])
        if s is not None and s.rung == rung:
            out[s.k] = i
    return out


def seats_pending(blocks: Sequence[Block]) -> bool:
    """The log ends with a seat's reply of a panel rung whose other seats have not all
    answered this turn: the next seat's turn is due."""
    if not blocks or blocks[-1].kind is not BlockKind.MODEL:
        return False
    s = seat_of(blocks[-1])
    if s is None:
        return False
    return len(seats_answered(blocks, s.rung, turn_start(blocks))) < s.n


def panel_hidden(blocks: Sequence[Block]) -> set[int]:
    """The seats' replies a prompt leaves out: all of a panel's turn still going (the next
    seat answers afresh, never seeing the others), or that went up the ladder (the next
    rung answers afresh); of a panel's turn that ended, all but its first reply (the history
    carries one answer a turn, which the others agreed with)."""
    groups: dict[tuple[int, str], list[int]] = {}
    start = 0
    for i, b in enumerate(blocks):
        if b.kind is BlockKind.AGENT and b.response_to is None:
            start = i
        s = seat_of(b)
        if s is not None:
            groups.setdefault((start, s.rung), []).append(i)
    out: set[int] = set()
    for idx in groups.values():
        n = max((s.n for i in idx if (s := seat_of(blocks[i])) is not None), default=0)
        seated = {s.k for i in idx if (s := seat_of(blocks[i])) is not None}
        up = any(k is MarkerKind.ESCALATED for i in idx for k, _ in blocks[i].markers)
        out.update(idx if up or len(seated) < n else idx[1:])
    return out


def normalised(text: str) -> str:
    """An answer as the vote compares it: JSON by its value, else its words (case folded,
    spacing and punctuation dropped)."""
    t = text.strip()
    try:
        return "json:" + json.dumps(json.loads(t), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        return " ".join(re.findall(r"\w+", t.casefold()))


@dataclass(frozen=True, slots=True)
class Vote:
    agree: bool
    words: str


def vote(answers: Sequence[str]) -> Vote:
    """The panel agrees when a strict majority of its seats gave the same answer (both of
    two, two of three …) as :func:`normalised` compares them."""
    n = len(answers)
    counts = Counter(normalised(a) for a in answers)
    top = counts.most_common(1)[0][1] if counts else 0
    if n and top * 2 > n:
        return Vote(True, f"{top} of {n} seats gave the same answer")
    return Vote(False, f"{len(counts)} different answers from {n} seats, no majority")


def causes_on(rules: Mapping[str, bool]) -> frozenset[str]:
    return frozenset(c for c in CAUSES if rules.get(c, False))


# --------------------------------------------------------------------------- the book


def book(kept: LadderBook | None, step: LadderStep, *, saved_tokens: int = 0) -> LadderBook:
    """``kept`` with one more reply on the ladder: answered where it ran (and the frontier
    tokens it saved, an estimate), or sent up for ``step.cause``."""
    from contemplation.models import LADDER_STEPS_KEPT, LadderBook

    out = kept.model_copy(deep=True) if kept is not None else LadderBook()
    if step.to is None:
        key = step.rung or step.model
        out.answered[key] = out.answered.get(key, 0) + 1
        out.saved_tokens_estimate += max(0, saved_tokens)
    else:
        out.escalated += 1
        out.to_agent += step.to == AGENT
    out.steps = [*out.steps, step][-LADDER_STEPS_KEPT:]
    return out


def book_lines(kept: LadderBook) -> list[str]:
    """The book as a person reads it (``ledger CONV``, ``status``)."""
    at = ", ".join(f"{k} {n}" for k, n in kept.answered.items()) or "none yet"
    lines = [
        f"ladder: answered locally: {at}; escalated {kept.escalated}, to the agent "
        f"{kept.to_agent}; ~{kept.saved_tokens_estimate:,} frontier tokens not spent "
        "(an estimate from the prompts' size)"
    ]
    for s in kept.steps:
        on = s.rung or s.model
        if s.to is None:
            lines.append(f"  turn {s.turn}  {on}: answered")
        else:
            lines.append(f"  turn {s.turn}  {on} → {s.to}: {CAUSES.get(s.cause or '', s.cause)}")
    return lines


NOT_SPENT = "frontier tokens not spent (an estimate from the prompts' size)"


def _many(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def sums_head(got: Mapping[str, Any], rungs: str = "") -> str:
    """The ladder's books summed over conversations (index.ledger.ladder's), in a phrase:
    ``answered locally 3{rungs}, escalated 4, to the agent 1; ~N frontier tokens not ...``."""
    return (
        f"answered locally {got['answered']:,}{rungs}, escalated {got['escalated']:,}, to the "
        f"agent {got['to_agent']:,}; ~{got['saved_tokens_estimate']:,} {NOT_SPENT}"
    )


def sums_line(got: Mapping[str, Any]) -> str:
    """Those sums in one line, the rungs listed in it (the dashboard's ledger card):
    ``4 conversations: answered locally 3 (qwen3 2, gemma 1), escalated 4, ...``."""
    each = [f"{r['rung'] or '(own model)'} {r['answered']:,}" for r in got["rungs"]]
    if got["more"]:
        each.append(f"{got['found'] - len(got['rungs']):,} more")
    listed = f" ({', '.join(each)})" if each else ""
    return f"{_many(got['conversations'], 'conversation')}: {sums_head(got, listed)}"


def sums_lines(got: Mapping[str, Any], *, more: str = "") -> list[str]:
    """Those sums as a person reads them (``contemplation ledger``): a line, then one a rung
    (the most answered first) and, when rungs were left out, how many and ``more``: the
    command that lists them; none for a home where no conversation has a ladder."""
    if not got["conversations"]:
        return []
    rungs = got["rungs"]
    lines = [f"ladder ({_many(got['conversations'], 'conversation')}): {sums_head(got)}"]
    lines += [
        f"  {r['rung'] or '(own model)'}  answered {r['answered']:,} "
        f"({_many(r['conversations'], 'conversation')})"
        for r in rungs
    ]
    if got["more"]:
        left = got["found"] - len(rungs)
        lines.append(f"  {_many(left, 'more rung')}" + (f": {more}" if more else ""))
    return lines


def last_rung(kept: LadderBook | None) -> str | None:
    """The words of the rung that last answered or where the turn went: for a status line."""
    if kept is None or not kept.steps:
        return None
    return step_words(kept.steps[-1].model_dump())


def step_words(s: Mapping[str, Any]) -> str:
    """:func:`last_rung` of a step as the model dumps it (``rung``, ``model``, ``to``,
    ``cause``): what a read command says from state.json's dump."""
    on = s["rung"] or s["model"]
    if s["to"] is None:
        return f"answered on {on}" + (" (a rung of the escalation ladder)" if s["rung"] else "")
    return f"escalated from {on} to {s['to']}: {CAUSES.get(s['cause'] or '', s['cause'])}"
