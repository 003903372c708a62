"""The turn's last phase: a streamed reply committed with what the turn learnt (the ledger's
usage and miss cause, the window's calibration, a cut prompt), its tool calls written as NEED
lines, and the markers that say how it ended early."""

from __future__ import annotations

from typing import Any

import structlog

from contemplation.base.testing import crashpoint
from contemplation.engine import escalation
from contemplation.engine.steps import AGAIN, Outcome
from contemplation.engine.turn.state import Attempt
from contemplation.errors import ContemplationError, ErrorKind
from contemplation.models import ChatRequest, ConvEvent, MarkerKind, ReplyCut, Status, Usage
from contemplation.needs import calls
from contemplation.prompt import budget, truncation
from contemplation.protocol import ledger, structured
from contemplation.protocol.parser import find_needs
from contemplation.writer import Streamed

log = structlog.get_logger("contemplation.turn")

Markers = list[tuple[MarkerKind, str]]
_NOT_WHOLE = frozenset({MarkerKind.INTERRUPTED, MarkerKind.ERROR})


async def finish(at: Attempt, got: Streamed, request: ChatRequest, planned: budget.Plan) -> Outcome:
    """Commit the reply: its tool calls, how it ended, what the server's usage says, and the
    status it leaves the conversation in, in one state write."""
    conv, rt, reply, on = at.conv, at.rt, at.reply, at.on
    usage = got.usage
    if request.schema is None:  # a reply held to a schema is offered no tools: it is the answer
        await write_tool_calls(at, got.calls)
    # a reply stopped before its end says so on every face (state.json reply_cut)
    markers, ended = ending(conv.id, got, request, rt.settings.max_reply_bytes)
    if usage is not None:
        markers += _learnt(at, usage, request, planned)
    # a reply with no NEED and no COMPLETE leaves the conversation idle: said in the same
    # state write that commits the reply
    said = reply.text
    status = Status.IDLE if not reply.saw_complete and not find_needs(said) else None
    error: tuple[ErrorKind, str] | None = None
    verdict = await structured.judge(request, said)  # held to a schema: checked off the loop
    if verdict is not None:
        markers.append(verdict.marker)
        status, error = verdict.status or status, verdict.error
    elif not said.strip() and not got.calls:  # nothing to show for the turn: not a success
        error = (ErrorKind.PROTOCOL, "the model returned an empty reply (no text and no tool call)")
        markers.append((MarkerKind.ERROR, error[1]))
        status = Status.ERROR
    up: escalation.Escalation | None = None
    if on.rung is not None:  # a ladder: the failure goes up a rung, said in one marker
        up = escalation.after_reply(
            rt.settings, on.rung, ended, verdict is not None and verdict.error is not None
        )
        if up is None and error is None:  # a panel rung's last seat: do the seats agree?
            up = escalation.verdict(rt.settings, on.rung, said, markers)
        if up is not None:
            markers = [m for m in markers if m[0] is not MarkerKind.ERROR] + [up.marker]
            status, error = up.status, up.error
        if (answered := escalation.answered(on.rung)) is not None:
            markers.insert(0, answered)
        if up is not None or not any(m[0] in _NOT_WHOLE for m in markers):  # the ladder's book
            prompt = (usage.prompt_eval_count if usage else None) or budget.estimate_request(
                request, planned.ratio
            )
            spent = prompt + ((usage.eval_count or 0) if usage else 0)
            escalation.record(at.w.state, on.rung, on.model, up, saved=spent)
    # the fsyncs of the commit run off the loop: the next conversation's request goes out;
    # the backend session is committed with the reply: the next start goes on in it
    try:
        await reply.finish(
            markers=markers,
            usage=usage,
            status=status,
            error=error,
            session=got.session,
            cut=ended,
        )
    finally:
        if reply.committed:  # a cancel that came meanwhile finds the reply committed
            on.guard.success()
            rt.notify(conv.id, ConvEvent.REPLY, usage=usage.model_dump() if usage else None)
    if up is not None and up.to:
        crashpoint("escalated")  # the marker durable, the next rung not asked yet
    return AGAIN


def _learnt(at: Attempt, usage: Usage, request: ChatRequest, planned: budget.Plan) -> Markers:
    """What the server's usage teaches: the ledger's figures and miss cause, a slot that kept
    no history or a restored one, a prompt the server cut, the model's token ratio. Returns
    the WARNING a cut or a full window gets."""
    conv, rt, on = at.conv, at.rt, at.on
    usage.queued_ms, usage.provider, usage.model = on.queued_ms, on.provider, on.model
    usage.context_window = usage.context_window or planned.window
    # a server that keeps no named slot's history; a slot file restored: held?
    restored = on.host.heard(on.slot, at.turn.key, usage, request.messages)
    last = rt.calibration.counts.last(at.turn.key)  # (before the check keeps this one's)
    # the server counted clearly fewer tokens than our count of what was sent: it cut it
    cut = truncation.check(rt.calibration.counts, at.turn.key, usage, request, planned.ratio)
    usage.miss = ledger.miss(  # why it recomputed what it held, where it did
        usage, held=last.tokens if last else None,
        extends=last is not None and truncation.extends(request, last),
        same_tools=last is None or truncation.same_tools(request, last),
        compacted=bool(planned.summarise or planned.notes), cut=bool(cut),
        restore=restored, first=at.w.state.turns == 0,
    )  # fmt: skip
    if cut and (counted := truncation.whole_count(usage)):  # fitted to that from now on
        kept = rt.calibration.cut(on.model, counted)
        cut += f"; the next requests to {on.model} are fitted to the {kept} tokens it kept"
    estimate = budget.estimate_request(request, planned.ratio)
    warning = cut or budget.context_warning(usage, estimate)
    markers: Markers = []
    if warning:
        usage.context_full = True
        markers.append((MarkerKind.WARNING, warning))
    if cut:  # its count is of what was left: never learnt (see truncation.py)
        log.warning("prompt_cut", conv=conv.id, model=on.model, why=cut)
    elif usage.prompt_eval_count:
        rt.calibration.observe(on.model, request.messages, usage.prompt_eval_count)
    return markers


async def write_tool_calls(at: Attempt, native: list[dict[str, Any]]) -> None:
    """Record native tool calls (or tool-call JSON the model wrote as text) as NEED lines."""
    reply = at.reply
    if not native and not calls.may_hold_calls(reply.text):
        return  # the common case: no call, and no JSON that could be one
    try:
        functions = at.rt.need_router().rules(at.w.meta.template).functions()
    except ContemplationError:
        functions = {}
    found = native or calls.calls_in_text(reply.text, functions)
    if not found:
        return
    if not native:
        await reply.note("tool calls written as JSON text were read as NEED lines")
    reply.content(("\n" if reply.text else "") + calls.need_lines(found, functions))


def ending(
    conv_id: str, got: Streamed, request: ChatRequest, limit: int
) -> tuple[Markers, ReplyCut | None]:
    """The markers that say how the reply ended early, and the ``reply_cut`` it records."""
    markers: Markers = []
    if got.truncated:
        markers.append(
            (MarkerKind.WARNING, f"the reply was cut at {limit} bytes (max_reply_bytes)")
        )
    cut = stopped(conv_id, got, request, limit)
    if cut is not None:
        markers.append((MarkerKind.NOTE, cut.message))
        log.warning("reply_cut", conv=conv_id, reason=cut.reason, tokens=cut.tokens)
    return markers, cut


def stopped(conv_id: str, got: Streamed, request: ChatRequest, limit: int) -> ReplyCut | None:
    """How the reply was stopped before its end (None: it ended by itself), in the words of
    its NOTE: a loop the daemon stopped, the server's token limit, or max_reply_bytes."""
    go_on = f"`contemplation continue {conv_id}` (MCP: conversation_continue)"
    tokens = got.usage.eval_count if got.usage is not None else None
    if got.repeating:
        return ReplyCut(
            reason="repeating",
            tokens=tokens,
            message=f"stopped: the model was repeating itself, {got.repeating}; what it said "
            "is kept. To go on: send a message that steers it (or set a repeat_penalty or a "
            f"higher temperature in the options), or {go_on} has it go on from here",
        )
    if got.over_time:
        return ReplyCut(
            reason="time",
            tokens=tokens,
            message=f"stopped: the reply took longer than its time budget ({got.over_time:g} s, "
            f"escalation.time_budget); what it said is kept; {go_on} has it go on from here",
        )
    if got.usage is not None and got.usage.done_reason == "length":
        cap = request.options.get("num_predict") or request.options.get("max_tokens")
        said = f"{tokens} tokens" if tokens else "its token limit"
        of = f", num_predict {cap}" if isinstance(cap, int) and cap > 0 else ""
        return ReplyCut(
            reason="length",
            tokens=tokens,
            message=f"stopped at the token limit ({said}{of}): the reply is not whole; "
            f"{go_on} has the model go on where it stopped",
        )
    if got.truncated:
        return ReplyCut(
            reason="bytes",
            tokens=tokens,
            message=f"stopped at max_reply_bytes ({limit} bytes): the reply is not whole",
        )
    return None
