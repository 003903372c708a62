"""The escalation ladder in the daemon: which rung a turn runs on, and where a failed reply
sends the turn next (the pure half, the ladder's config and its record in the log, is
:mod:`contemplation.protocol.escalation`).

A turn asks :func:`rung` once, before its slot: the conversation's ladder (its alias's, else
its template's) and the rung the log's last ``ESCALATED`` marker names. When the reply fails
for a named cause, :func:`escalate` gives the marker that sends the turn to the next rung (the
agent's, at the top), or None where there is no ladder, the cause's rule is off, or no rung is
left: then the failure ends the turn as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import structlog

from contemplation.backends import providers
from contemplation.backends.providers import Target
from contemplation.base.testing import crashpoint
from contemplation.engine.runtime import Runtime
from contemplation.errors import ContemplationError, ErrorKind
from contemplation.models import (
    Block,
    BlockKind,
    LadderStep,
    MarkerKind,
    Metadata,
    ReplyCut,
    State,
    Status,
)
from contemplation.protocol import escalation
from contemplation.protocol.conversation import goes_on
from contemplation.protocol.escalation import AGENT, Ladder, Rung, Seat
from contemplation.protocol.panel import Seated
from contemplation.settings import Settings
from contemplation.store.templates import Template
from contemplation.writer import ConvWriter

log = structlog.get_logger("contemplation.escalation")

#: a cut reply's cause (on a panel rung, the detail of a failed seat)
_CUT_CAUSE = {"repeating": "loop", "length": "length", "time": "time"}
#: the GO ON the ladder writes itself after a first cut at the token limit
GO_ON_ONCE = "asked by the escalation ladder once (the reply was cut at the token limit)"


@dataclass(frozen=True, slots=True)
class At:
    """Where a turn stands on its conversation's ladder: the ladder, the rung it runs on (None:
    the conversation's own model), the cause that brought it there, and whether this rung
    already went on once after a cut at the token limit."""

    ladder: Ladder
    name: str | None = None
    cause: str = ""
    continued: bool = False
    seat: Seat | None = None  # on a panel rung: the seat due
    answers: tuple[str, ...] = ()  # on a panel rung: the seats' answers before it this turn

    def next(self) -> Rung | None:
        return self.ladder.after(self.name)

    @property
    def rung(self) -> Rung | None:
        i = self.ladder.index(self.name) if self.name is not None else None
        return self.ladder.rungs[i] if i is not None else None

    @property
    def last_seat(self) -> bool:
        """The panel's last seat: its reply carries the panel's verdict."""
        return self.seat is not None and self.seat.k == self.seat.n


def ladder(settings: Settings, meta: Metadata, tpl: Template | None) -> Ladder | None:
    """The conversation's ladder: its alias's ``escalate``, else its template's (None: none, or
    a panel, whose seats fail on their own)."""
    if meta.panel:
        return None
    base = providers.target(settings, meta.backend, meta.model)
    entries: list[str] = []
    sticky, own = True, ""
    if base.alias is not None:
        alias = settings.aliases[base.alias]
        entries, sticky, own = list(alias.escalate), alias.sticky, base.alias
    if not entries and tpl is not None:
        raw = tpl.extra.get("escalate")
        entries = [str(e) for e in raw] if isinstance(raw, list) else []
        sticky = tpl.extra.get("sticky", True) is not False
        own = own or tpl.name
    if not entries:
        return None
    try:
        return escalation.parse(entries, aliases=settings.aliases, own=own, sticky=sticky)
    except escalation.LadderError as exc:  # a template's, checked against the aliases here
        log.warning("ladder_unusable", owner=own, why=str(exc))
        return None


def where(lad: Ladder | None, blocks: tuple[Block, ...]) -> At | None:
    """Where the turn due stands on ``lad``, from the log."""
    if lad is None:
        return None
    name = escalation.current(blocks, sticky=lad.sticky)
    if name is not None and (name == AGENT or lad.index(name) is None):
        name = None  # the agent's answer, or a rung no longer in the ladder: from the start
    start = escalation.turn_start(blocks)
    steps = escalation.steps(blocks, start)
    cause = steps[-1].cause if steps else ""
    since = steps[-1].block + 1 if steps else start
    continued = any(
        b.kind is BlockKind.MODEL and goes_on(b) for b in blocks[since:]
    )  # a GO ON on this rung: its next cut goes up
    at = At(lad, name, cause, continued)
    rung = at.rung
    if rung is None or rung.kind != "panel":
        return at
    done = escalation.seats_answered(blocks, rung.name, since)  # seat number → its reply
    # the first seat not answered (every one answered, a reply being redone: the last)
    k = min(next(k for k in range(1, rung.seats + 2) if k not in done), rung.seats)
    answers = tuple(blocks[i].text for j, i in sorted(done.items()) if j != k)
    return replace(at, seat=Seat(rung.name, k, rung.seats, rung.models[k - 1]), answers=answers)


def seats(blocks: tuple[Block, ...], rung: str) -> list[int]:
    """The blocks of the seats of panel ``rung`` that answered the turn due."""
    return list(escalation.seats_answered(blocks, rung, escalation.turn_start(blocks)).values())


def target(settings: Settings, meta: Metadata, base: Target, at: At | None) -> Target:
    """The turn's target on its rung: an alias rung brings its providers, model and options
    (over the conversation's own: a rung's sampling is why it is there); a model rung keeps
    the conversation's providers with its own options only (the alias's are the small
    model's)."""
    rung = at.rung if at is not None else None
    if at is None or rung is None:
        return base
    kind, model = rung.kind, rung.model
    if at.seat is not None:  # a panel rung's seat: a model, or an alias as an alias rung is
        model = at.seat.model
        kind = "alias" if model in settings.aliases else "model"
    if kind == "alias":  # its options over the conversation's: its sampling is the point
        got = providers.target(settings, model, model, think=meta.think)
        return replace(got, options={**meta.options, **got.options})
    return replace(base, model=model, options=dict(meta.options))


@dataclass(frozen=True, slots=True)
class Escalation:
    """How a failed reply ends: its marker, the status it leaves and (to the agent) the error
    it records. ``to`` is empty for the one GO ON after a first cut at the token limit."""

    marker: tuple[MarkerKind, str]
    to: str
    cause: str
    error: tuple[ErrorKind, str] | None = None

    @property
    def status(self) -> Status:
        return Status.ERROR if self.error is not None else Status.PENDING


def after_reply(
    settings: Settings, at: At | None, cut: ReplyCut | None, schema_missed: bool
) -> Escalation | None:
    """How a streamed reply that failed goes on: a loop stopped, a second cut at the token
    limit (the first goes on once, by a GO ON of the ladder's own), a schema missed after its
    retry. None: it ends as it always did."""
    if at is None:
        return None
    if at.seat is not None:  # a seat of a panel rung failed: the rule seat (no GO ON first)
        why = (_CUT_CAUSE.get(cut.reason) if cut is not None else None) or (
            "schema" if schema_missed else None
        )
        return escalate(settings, at, why) if why else None
    if cut is not None and cut.reason == "repeating":
        return escalate(settings, at, "loop")
    if cut is not None and cut.reason == "time":
        return escalate(settings, at, "time", f"{settings.escalation.time_budget:g} s")
    if cut is not None and cut.reason == "length" and settings.escalation.length:
        if not at.continued and escalate(settings, at, "length") is not None:
            return Escalation((MarkerKind.GO_ON, GO_ON_ONCE), "", "length")
        return escalate(settings, at, "length")
    if schema_missed:
        return escalate(settings, at, "schema")
    return None


def escalate(settings: Settings, at: At | None, cause: str, detail: str = "") -> Escalation | None:
    """The ``ESCALATED`` marker for a reply that failed for ``cause`` (None: no ladder, the
    rule is off, or no rung is left). On a panel rung any failure of a seat is the cause
    ``seat`` (its own cause in the detail)."""
    if at is not None and at.seat is not None and cause not in escalation.PANEL_CAUSES:
        own = escalation.CAUSES.get(cause, cause) + (f", {detail}" if detail else "")
        cause, detail = "seat", f"seat {at.seat.k} of {at.seat.n}, {at.seat.model}: {own}"
    if at is None or not settings.escalation.rules().get(cause, False):
        return None
    nxt = at.next()
    if nxt is None:
        return None
    text = escalation.marker_text(cause, nxt.name, detail)
    error = None
    if nxt.kind == "agent":
        on = at.name or "the conversation's own model"
        error = (ErrorKind.PROTOCOL, f"escalated to the agent: {escalation.CAUSES[cause]} on {on}")
    log.info("escalated", cause=cause, rung=at.name, to=nxt.name)
    return Escalation((MarkerKind.ESCALATED, text), nxt.name, cause, error)


def record(
    state: State, at: At | None, model: str, up: Escalation | None, *, saved: int = 0
) -> None:
    """One reply on the ladder in the conversation's book (state.json ``ladder``, written with
    the reply's commit or its marker): answered where it ran, with the frontier tokens it did
    not spend (``saved``, an estimate), or sent up. The ladder's own GO ON is no step."""
    if at is None or (up is not None and not up.to):
        return
    if up is None and at.seat is not None and not at.last_seat:
        return  # a panel's turn is answered by its last seat (or sent up by any)
    step = LadderStep(
        turn=state.turns + 1,
        rung=at.name or "",
        model=model,
        cause=up.cause if up is not None else None,
        to=up.to if up is not None else None,
    )
    state.ladder = escalation.book(state.ladder, step, saved_tokens=0 if up else saved)


def answered(at: At | None) -> tuple[MarkerKind, str] | None:
    """The NOTE on a reply a rung above the conversation's own model wrote."""
    if at is None or at.name is None:
        return None
    return MarkerKind.NOTE, escalation.answered_note(at.name, at.cause, at.ladder.owner, at.seat)


def verdict(
    settings: Settings, at: At | None, text: str, markers: list[tuple[MarkerKind, str]]
) -> Escalation | None:
    """The panel's verdict, on its last seat's whole reply ``text``: the seats agree (a NOTE
    added to ``markers`` says so), or they disagree and the rule ``disagree`` sends the turn
    up (returned; with the rule off a NOTE says they disagree). None: no step up."""
    if at is None or not at.last_seat:
        return None
    got = escalation.vote([*at.answers, text])
    if got.agree:
        markers.append((MarkerKind.NOTE, f"{escalation.AGREED}{got.words} ({escalation.RULE})"))
        return None
    up = escalate(settings, at, "disagree", got.words)
    if up is None:
        markers.append(
            (MarkerKind.NOTE, f"the panel's seats disagree: {got.words} ({escalation.RULE})")
        )
    return up


def escalate_rounds(rt: Runtime, w: ConvWriter, due: Seated) -> bool:
    """A reply past the need-round limit: on a ladder whose ``needs`` rule is on, its NEEDs
    are left and the next rung takes the turn (one ESCALATED marker after it). False: the
    limit's NOTE and the agent, as always."""
    if w.meta.panel or not due.log or due.log[-1].kind is not BlockKind.MODEL:
        return False
    try:
        tpl = rt.template(w.meta.template) if w.meta.template else None
    except ContemplationError:
        tpl = None
    at = where(ladder(rt.settings, w.meta, tpl), due.log)
    detail = f"{due.nxt.rounds} rounds, max_need_rounds = {rt.settings.max_need_rounds}"
    up = escalate(rt.settings, at, "needs", detail)
    if up is None:
        return False
    w.record_asked(())
    if up.error is not None:
        w.gave_up(*up.error)
    else:
        w.state.status = Status.PENDING
    record(w.state, at, w.meta.model, up)
    w.append_marker(*up.marker)
    crashpoint("escalated")  # the marker durable, the next rung not asked yet
    return True
