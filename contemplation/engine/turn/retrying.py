"""How a model turn that did not end with a reply ends, and where it goes next.

* a provider resting (its breakers open): the turn waits for it (:func:`rest`);
* a failure: retried with backoff (transient), given up with a visible ERROR (permanent, or
  too many attempts), or, when the provider itself is in trouble and the conversation's alias
  has another provider free, redone there at once (:func:`failed`, :func:`fail_over`); a
  429's Retry-After pauses that provider for every conversation (:func:`pause`);
* cancelled by the agent (:func:`cancelled`), or cut by a failed write (:func:`write_failed`);
* crashed: something unexpected raised once the turn had begun (:func:`crashed`): redone
  once, and the same failure twice is an ERROR, never a turn redone at every rescan.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping

import structlog

from contemplation.backends.providers import Target
from contemplation.base.testing import crashpoint
from contemplation.config.reload import backend_fingerprint
from contemplation.engine import escalation
from contemplation.engine.provider import Provider
from contemplation.engine.runtime import Runtime, backoff
from contemplation.engine.steps import AGAIN, Outcome, Wait
from contemplation.engine.turn.state import Attempt, On, Turn
from contemplation.errors import BackendError, ConfigError, ErrorKind
from contemplation.models import ConvEvent, Crashes, MarkerKind, Status
from contemplation.protocol.logformat import one_line
from contemplation.writer import ConvWriter, LiveReply, clear_cancel

log = structlog.get_logger("contemplation.turn")

RETRY_AFTER_CAP = 3600.0  # the longest pause a server's Retry-After can ask of a provider
SAME_CRASHES = 2  # a turn that raised the same thing this often is not redone again
ANY_CRASHES = 3  # ... nor one that raised this often, whatever it raised
MAX_CAUSE = 300  # characters of the exception kept in the markers and the state


def rest(rt: Runtime, w: ConvWriter, until: float, target: Target) -> Wait:
    """Every provider the turn may use rests: wait for the first to be tried again instead of
    calling one. The words name each provider and why it rests."""
    meta = w.meta
    if w.state.next_retry_at is None or w.state.next_retry_at < until:
        why = "; ".join(_why_resting(rt, p, target.model) for p in target.providers)
        of = f"{target.alias}: " if target.alias else ""
        w.retry_at(
            until,
            settings=backend_fingerprint(rt.settings, meta.backend),
            kind=ErrorKind.CIRCUIT_OPEN,
            message=f"{of}{why}; resting until {time.strftime('%H:%M:%S', time.localtime(until))}",
        )
    return Wait(until)


def _why_resting(rt: Runtime, provider: str, model: str) -> str:
    guard = rt.guard(provider, model)
    if guard.server.watched:
        return f"{provider} cannot be reached (probed in the background)"
    return f"{provider} ({model}) failed {guard.failures} times in a row"


# a failure that says nothing answers at the provider's address: an alias's turns go to its
# other providers, and a background probe (not a user's turn) finds out when it is back
_DEAD = frozenset({ErrorKind.UNREACHABLE, ErrorKind.CONNECTION})


def pause(rt: Runtime, on: On, exc: BackendError) -> list[str]:
    """The provider is in trouble. A 429 or 503 with Retry-After pauses it (for every
    conversation) that long; an alias's provider that cannot be reached while another is
    not resting rests until a background probe finds it back, one in other trouble (or the
    last one left) for the breaker's cooldown, so that its turns go elsewhere. One that went
    away is asked its limits again when it is back. Returns the alias's other providers that
    may take the turn now."""
    if exc.server_down or exc.kind is ErrorKind.CUT:
        on.host.stale()
    several = len(on.target.providers) > 1
    others = [
        p
        for p in on.target.providers
        if p != on.provider and rt.guard(p, on.model).resting() is None
    ]
    if others and exc.retry_after is None and exc.kind in _DEAD:
        rt.watch(on.provider)  # the last one left is not watched: its turn tries it again
    elif exc.retry_after is not None or several:
        wait_s = exc.retry_after if exc.retry_after is not None else rt.settings.breaker_cooldown
        on.guard.server.trip(rt.clock() + min(wait_s, RETRY_AFTER_CAP))
    return others


def fail_over(at: Attempt, exc: BackendError, *, others: list[str], attempt: int) -> Outcome:
    """Redo the turn at once on another provider of the alias: a reply cut mid-stream is
    marked INTERRUPTED (and redone whole, as after any cut); one that had not started leaves
    a NOTE saying which provider failed and why."""
    conv, rt, w, reply, on = at.conv, at.rt, at.w, at.reply, at.on
    where = f"another provider of {on.target.alias} ({', '.join(others)})"
    if not reply.abort(MarkerKind.INTERRUPTED, f"{on.provider}: {exc}; redone on {where}"):
        w.append_marker(MarkerKind.NOTE, f"{on.provider} failed ({exc}); the turn goes to {where}")
    w.retry_at(
        rt.clock(),
        settings=backend_fingerprint(rt.settings, w.meta.backend),
        kind=exc.kind,
        message=f"{on.provider}: {exc}",
        attempt=attempt,
    )
    log.warning("fail_over", conv=conv.id, provider=on.provider, error=str(exc), to=others)
    rt.notify(conv.id, ConvEvent.RETRYING, error=str(exc), attempt=attempt, delay=0.0)
    return AGAIN


def _seconds(delay: float) -> str:
    return f"{delay:.1f} s" if delay < 10 else f"{delay:.0f} s"


def write_failed(turn: Turn, exc: OSError) -> Wait:
    """messages.log or state.json could not be written (disk full, file too large). The next
    step recovers first, as after a restart: it finds the cut reply (by its intent, or right
    after the claimed message's block) and marks it INTERRUPTED, so the turn is redone and a
    cut reply never stands as a finished one, and the claimed message is taken once."""
    conv, rt, seen, w = turn.conv, turn.rt, turn.seen, turn.w
    seen.recovered.discard(conv.id)
    seen.cut_by[conv.id] = f"writing messages.log failed: {exc.strerror or exc}"
    message = (
        f"writing messages.log failed ({exc.strerror or exc}); the reply will be marked "
        "interrupted and redone once the disk has room"
    )
    log.error("write_failed", conv=conv.id, error=str(exc))
    with contextlib.suppress(OSError):  # the state write may fail for the same reason
        w.record_error(ErrorKind.WRITE_FAILED, message, status=Status.ERROR)
    rt.notify(conv.id, ConvEvent.ERROR, error=message)
    return Wait(rt.clock() + rt.settings.rescan_interval)


def cancelled(at: Attempt) -> Outcome:
    conv, rt, w, reply = at.conv, at.rt, at.w, at.reply
    clear_cancel(conv)
    if not reply.abort(MarkerKind.CANCELLED, "generation stopped by the agent"):
        w.append_marker(MarkerKind.CANCELLED, "the turn was cancelled by the agent")
    w.show(Status.CANCELLED)
    rt.notify(conv.id, ConvEvent.CANCELLED)
    return AGAIN


# what says the provider itself is in trouble (not the request, not the model): the provider
# rests and an alias's turn goes to another of its providers at once
_PROVIDER_TROUBLE = frozenset(
    {ErrorKind.SERVER_BUSY, ErrorKind.TIMEOUT, ErrorKind.CUT, ErrorKind.STALL}
)


def unusable(turn: Turn, lineup: Mapping[str, Provider]) -> Outcome | None:
    """None when every provider's client can be made (each once, by its provider). Else the
    conversation names one the settings cannot make (no such provider or kind, a table its
    kind refuses, a plugin's backend that fails to be made): an ERROR the agent reads in the
    log, not a crash retried behind its back. Its next message, once the settings are fixed
    (and reloaded), tries again."""
    conv, rt, w = turn.conv, turn.rt, turn.w
    try:
        for provider in lineup.values():
            provider.backend  # noqa: B018 (made here: a provider the settings cannot make raises)
    except ConfigError as exc:
        message = f"cannot use backend {w.meta.backend!r}: {exc}"
    else:
        return None
    message = given_up(w, message)
    w.gave_up(ErrorKind.CONFIG, message)
    log.error("turn_failed", conv=conv.id, error=message)
    rt.notify(conv.id, ConvEvent.ERROR, error=message)
    return AGAIN if w.meta.panel else Wait(None)  # a panel's other seats go on


def failed(at: Attempt, exc: BackendError) -> Outcome:
    conv, rt, w, reply, on = at.conv, at.rt, at.w, at.reply, at.on
    attempt = w.state.retry_count + 1
    transient = exc.transient and attempt < rt.settings.retry.max_attempts
    guard = on.guard
    if exc.transient:
        guard.failure(exc)
    elif exc.status_code is not None:
        guard.server.success()  # the server answered: it is up, the request was wrong
    if transient and (exc.server_down or exc.kind in _PROVIDER_TROUBLE):
        others = pause(rt, on, exc)
        if others:
            return fail_over(at, exc, others=others, attempt=attempt)
    if transient:
        delay = backoff(rt, attempt, exc.retry_after)
        resting = guard.resting()
        if resting is not None:  # the breaker just opened: that is when the retry comes
            delay = max(delay, resting - rt.clock())
        reply.abort(MarkerKind.INTERRUPTED, f"{exc}; retrying in {_seconds(delay)}")
        when = rt.clock() + delay
        w.retry_at(
            when,
            settings=backend_fingerprint(rt.settings, w.meta.backend),
            kind=exc.kind,
            message=str(exc),
            attempt=attempt,
        )
        log.warning(
            "turn_retry", conv=conv.id, error=str(exc), attempt=attempt, delay=round(delay, 2)
        )
        rt.notify(conv.id, ConvEvent.RETRYING, error=str(exc), attempt=attempt, delay=delay)
        return Wait(when)
    message = str(exc) if exc.transient is False else f"{exc} (gave up after {attempt} attempts)"
    up = escalation.escalate(rt.settings, on.rung, "error", one_line(message, MAX_CAUSE))
    if up is not None:  # a ladder: the next rung takes the turn
        return _escalated(at, up, exc.kind, message)
    return _give_up(at, kind=exc.kind, message=message)


def _escalated(at: Attempt, up: escalation.Escalation, kind: ErrorKind, message: str) -> Outcome:
    """The turn's failure sends it up its ladder: one ESCALATED marker after the reply (or
    after the agent's message, when no reply began), then the next rung's turn is due (the
    agent's: the conversation waits for it, the error said)."""
    conv, rt, w, reply = at.conv, at.rt, at.w, at.reply
    st = w.state
    st.retry_count, st.next_retry_at = 0, None
    if up.error is not None:
        st.last_error = None
        w.gave_up(*up.error)
    else:
        st.status = Status.PENDING
    escalation.record(st, at.on.rung, at.on.model, up)
    mark, text = up.marker
    if not reply.abort(mark, text):
        w.append_marker(mark, text)
    log.warning("turn_escalated", conv=conv.id, cause=up.cause, to=up.to, error=message)
    rt.notify(conv.id, ConvEvent.ERROR if up.error else ConvEvent.RETRYING, error=message)
    crashpoint("escalated")  # the marker durable, the next rung not asked yet
    return AGAIN


def _give_up(at: Attempt, *, kind: ErrorKind, message: str) -> Outcome:
    """One ERROR that ends the turn; the conversation waits for the agent. In a panel the
    round goes on at once, in the same session: the other seats still due answer (a seat
    asked ahead on its held stream, not asked again)."""
    conv, rt, w, reply = at.conv, at.rt, at.w, at.reply
    message = given_up(w, message, reply=reply)
    w.gave_up(kind, message)
    log.error("turn_failed", conv=conv.id, error=message)
    rt.notify(conv.id, ConvEvent.ERROR, error=message)
    return AGAIN if w.meta.panel else Wait(None)


def given_up(w: ConvWriter, message: str, *, reply: LiveReply | None = None) -> str:
    """The ERROR that ends a turn for good, written where its seat's thread ends: after the
    reply when it began, else (nothing written) in a block of the seat's own, its header then
    the ERROR. In a panel a marker after the log's last block would end another seat's reply
    (or the agent's message): the failed seat's thread would still want its turn, asked again
    at every rescan, and the other seat's answer would read as failed. A panel's seat's ERROR
    also says how to go on. Returns the message as written (without a panel: as given)."""
    meta = w.meta
    if meta.panel:
        label = meta.model_label
        message = (
            f"{message} [seat {label}: the other seats' answers stand; "
            f"`contemplation set-model {w.conv.id} MODEL --seat {label}` moves this seat "
            f"for the next message, `contemplation retract {w.conv.id}` withdraws its "
            "failed turn]"
        )
    if reply is not None and reply.abort(MarkerKind.ERROR, message):
        return message
    if not meta.panel:
        w.append_marker(MarkerKind.ERROR, message)
        return message
    own = w.reply(meta.sender_label(), meta.agent_label, f"failed-{w.state.log.size}")
    own.begin()  # its intent journaled, then its header
    own.abort(MarkerKind.ERROR, message)
    return message


def crashed(at: Attempt, exc: Exception) -> Outcome:
    """Something unexpected raised once the turn had begun (a reply no code was ready for).
    It used to escape, and the turn was redone at every rescan, its request sent again each
    time (158 model requests for one message). Now the first time the reply is marked
    INTERRUPTED and the turn redone; the same failure a second time (or :data:`ANY_CRASHES`
    of any kind) ends it with one ERROR that names the cause, and the conversation waits for
    the agent's next message. The count lives in state.json (:class:`Crashes`), so a restart
    does not start it over."""
    conv, w, reply = at.conv, at.w, at.reply
    cause = one_line(f"{type(exc).__name__}: {exc}", MAX_CAUSE)
    if reply.committed:  # the reply stands; what raised came after it
        log.error("after_reply_failed", conv=conv.id, error=cause, exc_info=exc)
        return AGAIN
    st = w.state
    before = st.crashes
    if before is None or (before.turns, before.messages) != (st.turns, st.messages_processed):
        before = None
    same = before.same + 1 if before is not None and before.cause == cause else 1
    total = before.total + 1 if before is not None else 1
    st.crashes = Crashes(
        turns=st.turns, messages=st.messages_processed, cause=cause, same=same, total=total
    )
    if same < SAME_CRASHES and total < ANY_CRASHES:
        log.warning("turn_crashed", conv=conv.id, error=cause, redone=True, exc_info=exc)
        if not reply.abort(MarkerKind.INTERRUPTED, f"the turn failed: {cause}; it is redone once"):
            w.save()  # nothing was written: the count alone
        return AGAIN
    how = "the same way twice" if same >= SAME_CRASHES else f"{total} times"
    message = (
        f"the turn failed {how}: {cause}; it is not redone (the agent's next message is "
        "answered again)"
    )
    return _give_up(at, kind=ErrorKind.INTERNAL, message=message)
