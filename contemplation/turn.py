"""One model turn: build the request, stream the reply into the log, record how it went.

A turn runs under the lock and writer of the step that decided it (one lock, one read of the
state per step). The context requirements are gathered (first turn only) and a backend slot
is awaited (queued per model); then the history is fitted to the model's window, the reply
streams into ``messages.log`` as it arrives, and a failure becomes either a retry
(transient) or a visible ERROR (permanent). Native tool calls are written into the reply as
``NEED:`` lines under a ``(tool call …)`` line, so the ordinary answer cycle answers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from contemplation import budget
from contemplation.aio import on_thread, settled
from contemplation.backends.base import Backend
from contemplation.backends.capabilities import resolve_think
from contemplation.context import saved_context
from contemplation.conversation import still_due
from contemplation.errors import BackendError, ContemplationError, ErrorKind
from contemplation.layout import Conv, Template
from contemplation.models import (
    BackendSession,
    Block,
    ChatRequest,
    ConvEvent,
    ErrorInfo,
    MarkerKind,
    Metadata,
    Status,
    StreamEvent,
    Usage,
)
from contemplation.needs import rules
from contemplation.parser import find_needs
from contemplation.prompts import NeedForm, build_request, need_forms
from contemplation.reload import backend_fingerprint
from contemplation.runtime import Runtime, backoff, set_status
from contemplation.scheduler import Held
from contemplation.steps import AGAIN, Outcome, Wait
from contemplation.tracking import Tracked
from contemplation.writer import ConvWriter, ReplyStream, clear_cancel, now_iso

log = structlog.get_logger("contemplation.turn")

CANCEL_CHECK_INTERVAL = 0.2
SUMMARY_TIMEOUT = 120.0  # seconds for the one summary call a turn may make
TOOL_CALL_PREFIX = "(tool call "
LONG_HISTORY = 200  # blocks above which a turn's request is built and fitted on a thread
_TEXT = frozenset({"content", "thinking"})


class _Gone(Exception):
    """The conversation's folder was deleted while its reply streamed: stop the stream."""


class _Cancelled(Exception):
    """The agent asked to cancel the in-flight generation."""


@dataclass(frozen=True, slots=True)
class _Prepared:
    """What is settled before the slot: context text, tools offered, the think value."""

    context: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    think: bool | str | None = None
    note: str | None = None  # a downgrade to record in the log
    error: BackendError | None = None  # a request the model cannot serve
    window: int | None = None  # the tokens a request gets, when the backend knows


async def run_turn(conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter) -> Outcome:
    """The model's turn, under the lock and writer of the step that decided it."""
    meta = w.meta
    backend = rt.backend(meta.backend)
    breaker = rt.guard(meta)
    until = breaker.resting()
    if until is not None:
        return _rest(rt, w, until)
    prepared = await _prepare(conv, rt, meta)
    planned = await _plan(conv, rt, seen, w, prepared)  # while the slot may still be busy
    if planned is None:
        return AGAIN
    async with rt.scheduler(meta.backend).slot(meta.model) as held:
        # checked again with the slot held: the turns queued behind a failing one must not
        # each try the server once more
        if not breaker.allow():
            until = breaker.resting() or rt.clock() + 0.5
        else:
            try:
                return await _stream(
                    conv,
                    rt,
                    seen,
                    w,
                    backend=backend,
                    prepared=prepared,
                    planned=planned,
                    held=held,
                )
            finally:
                breaker.release()  # a probe that ended without a verdict lets another try
    return _rest(rt, w, until)


def _rest(rt: Runtime, w: ConvWriter, until: float) -> Wait:
    """The backend keeps failing: wait for the breaker instead of calling it again."""
    meta = w.meta
    if w.state.next_retry_at is None or w.state.next_retry_at < until:
        w.state.next_retry_at = until
        w.state.retry_settings = backend_fingerprint(rt.settings, meta.backend)
        w.record_error(
            ErrorKind.CIRCUIT_OPEN,
            f"{meta.backend} ({meta.model}) failed {rt.guard(meta).failures} times in a row; "
            f"resting until {time.strftime('%H:%M:%S', time.localtime(until))}",
            status=Status.RETRYING,
        )
    return Wait(until)


async def _prepare(conv: Conv, rt: Runtime, meta: Metadata) -> _Prepared:
    context = await _context(conv, rt, meta)
    caps = await rt.capabilities(meta.backend, meta.model)  # None: the turn reports the error
    think: bool | str | None = meta.think
    note: str | None = None
    if caps is not None and meta.think is not None:
        try:
            think, note = resolve_think(
                caps, meta.think, rt.settings.think_unsupported, model=meta.model
            )
        except BackendError as exc:
            return _Prepared(context=context, error=exc)
    tools: tuple[dict[str, Any], ...] = ()
    if caps is not None and caps.tools and rt.settings.native_tools:
        try:
            tools = tuple(rt.need_router().tool_specs(template=meta.template))
        except ContemplationError:
            tools = ()
    return _Prepared(
        context=context,
        tools=tools,
        think=think,
        note=note,
        window=(caps.request_window or caps.context_length) if caps is not None else None,
    )


async def _context(conv: Conv, rt: Runtime, meta: Metadata) -> str:
    """The context sections for the system prompt (gathered once, then read from context/)."""
    if not meta.context_requirements:
        return ""
    saved = saved_context(conv)
    if saved:
        return saved
    try:
        _, text = await rt.context_assembler().assemble(conv, meta.context_requirements)
    except (ContemplationError, OSError) as exc:
        log.warning("context_failed", conv=conv.id, error=str(exc))
        return ""
    return text


def _offered(rt: Runtime, meta: Metadata) -> tuple[NeedForm, ...] | None:
    """The NEED forms the system prompt offers: those a rule answers with a tool that is set
    up (None when the rules cannot be built: the built-in forms)."""
    try:
        return need_forms(rt.need_router().offered(meta.template))
    except ContemplationError:
        return None


def _window(request: ChatRequest, known: int | None) -> int:
    """The context window this request gets: its own num_ctx option, else what the backend
    says (Ollama: the num_ctx it sends; others: the model's), else a conservative 4096."""
    return int(request.options.get("num_ctx") or known or 4096)


@dataclass(frozen=True, slots=True)
class _Planned:
    """The request fitted to the model's window, and what its reply is measured against."""

    fitted: budget.Plan
    window: int
    ratio: float


async def _plan(
    conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter, prepared: _Prepared
) -> _Planned | None:
    """The turn's request, built from the log before the slot is granted (the lock is held
    since the step decided the turn, so the log cannot change meanwhile but for bytes
    appended by hand, which wait for the next step). None: no turn is due after all."""
    meta = w.meta
    parsed = await seen.view(conv, meta.agent_label).refreshed(fd=w.fd)
    if not still_due(parsed.blocks):
        return None
    tpl = rt.template(meta.template) if meta.template else None
    fit = functools.partial(
        _fitted,
        meta,
        parsed.blocks,
        template=tpl,
        needs=_offered(rt, meta),
        prepared=prepared,
        session=w.state.backend_session,
        ratio=rt.calibration.ratio(meta.model),
    )
    # pure work in proportion to the history (~10 µs a block): a long one is fitted on a
    # thread, not on the loop (5,500 blocks took ~100 ms)
    return await on_thread(fit) if len(parsed.blocks) > LONG_HISTORY else fit()


def _fitted(
    meta: Metadata,
    blocks: tuple[Block, ...],
    *,
    template: Template | None,
    needs: tuple[NeedForm, ...] | None,
    prepared: _Prepared,
    session: BackendSession | None,
    ratio: float,
) -> _Planned:
    """The request built from ``blocks`` and fitted to the window (pure: runs on a thread)."""
    request = build_request(
        meta,
        blocks,
        template_prompt=template.system_prompt if template else "",
        prompt_mode=template.prompt_mode if template else "add",
        needs=needs,
        context=prepared.context,
    )
    request = replace(  # session: what the server already holds of the history (OpenCode)
        request, tools=prepared.tools, think=prepared.think, session=session
    )
    window = _window(request, prepared.window)
    reserve = budget.reply_reserve(window, request.options)
    fitted = budget.plan(request, window, blocks=blocks, reserve=reserve, ratio=ratio)
    return _Planned(fitted=fitted, window=window, ratio=ratio)


async def _stream(
    conv: Conv,
    rt: Runtime,
    seen: Tracked,
    w: ConvWriter,
    *,
    backend: Backend,
    prepared: _Prepared,
    planned: _Planned,
    held: Held,
) -> Outcome:
    meta = w.meta
    w.state.generating_since = rt.clock()  # status shows who holds the slot, since when
    w.state.status = Status.GENERATING  # written by _pump while the request is on its way
    w.state.pending_needs = []
    rt.notify(conv.id, ConvEvent.GENERATING, model=meta.model)
    reply = w.reply(meta.sender_label(), meta.agent_label, f"reply-{w.state.log.size}")
    if prepared.error is not None:
        return _failed(conv, rt, w, reply, prepared.error)
    if prepared.note:
        await _note(rt, reply, prepared.note)
    return await _run_reply(
        conv, rt, w, seen=seen, backend=backend, reply=reply, planned=planned, held=held
    )


async def _run_reply(
    conv: Conv,
    rt: Runtime,
    w: ConvWriter,
    *,
    seen: Tracked,
    backend: Backend,
    reply: ReplyStream,
    planned: _Planned,
    held: Held,
) -> Outcome:
    """Fit the request (a summary call at most), stream the reply and end it one of five
    ways: finished, cancelled, interrupted by a stop, failed (retry or error), or cut by a
    failed write (redone once the disk has room)."""
    try:
        try:
            request, notes = await _fit(conv, rt, w, backend, planned.fitted)
            for note in notes:
                await _note(rt, reply, note)
            got = await _pump_guarded(conv, rt, backend, request, reply, held=held)
        finally:
            held.release()  # the server is done with it: the commit below needs no slot
    except _Cancelled:
        return _cancelled(conv, rt, w, reply)
    except _Gone:  # the stream is closed; there is no folder left to write the outcome in
        log.warning("conversation_removed", conv=conv.id, during="a reply")
        return AGAIN
    except asyncio.CancelledError:
        if conv.id in seen.cancelled:
            seen.cancelled.discard(conv.id)
            return _cancelled(conv, rt, w, reply)
        reply.abort(
            MarkerKind.INTERRUPTED, "the daemon stopped during this reply; it will be redone"
        )
        set_status(w, Status.PENDING)
        raise
    except BackendError as exc:
        if exc.kind == "cancelled":  # the server aborted the turn at our request
            return _cancelled(conv, rt, w, reply)
        return _failed(conv, rt, w, reply, exc)
    except OSError as exc:
        return _write_failed(conv, rt, seen, w, exc)
    try:
        return await _finish(conv, rt, w, reply, got, request=request, planned=planned)
    except OSError as exc:
        return _write_failed(conv, rt, seen, w, exc)


async def _note(rt: Runtime, reply: ReplyStream, text: str) -> None:
    """A NOTE on how the reply is made. Before the reply starts it is a marker of its own,
    appended and made durable by the committer (off the loop: two fsyncs)."""
    if reply.started:
        reply.note(text)
    else:
        await rt.committer.run(reply.w.marker_steps(MarkerKind.NOTE, text))


async def _fit(
    conv: Conv, rt: Runtime, w: ConvWriter, backend: Backend, fitted: budget.Plan
) -> tuple[ChatRequest, list[str]]:
    """The request that fits the window, and the NOTEs that say how. When the plan asks for
    a summary this is the turn's one summary call; if it fails, the oldest turns are left
    out. Raises _Cancelled on the agent's cancel."""
    if not fitted.summarise:
        return fitted.request, list(fitted.notes)
    await rt.committer.run(w.save_steps(durable=False))  # says generating while it is made
    text, why = await _summarise(conv, rt, w.meta, backend, fitted)
    return fitted.with_summary(text) if text else fitted.without_summary(why)


async def _summarise(
    conv: Conv, rt: Runtime, meta: Metadata, backend: Backend, fitted: budget.Plan
) -> tuple[str, str]:
    """The model's summary of what ``fitted`` leaves out, or "" and why there is none. One
    call, at most SUMMARY_TIMEOUT seconds, budget.SUMMARY_MAX_TOKENS tokens, no thinking."""
    caps = await rt.capabilities(meta.backend, meta.model)
    think = False if caps is not None and caps.thinking else None
    # what is left out is the long part of a long history: made on a thread
    request = await on_thread(functools.partial(budget.summary_request_for, fitted, think=think))
    parts: list[str] = []
    cancel_path = conv.cancel_flag
    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
    try:
        async with asyncio.timeout(SUMMARY_TIMEOUT):
            stream = backend.stream(request)
            try:
                async for ev in stream:
                    if ev.kind == "content":
                        parts.append(ev.text)
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
                        if cancel_path.exists():
                            raise _Cancelled
            finally:
                await stream.aclose()
    except TimeoutError:
        return "", f"no answer within {SUMMARY_TIMEOUT:g} s"
    except BackendError as exc:
        return "", str(exc)
    text = "".join(parts).strip()
    if not text:
        return "", "the model wrote no summary"
    log.info("history_summarised", conv=conv.id, messages=len(fitted.summarise))
    return text, ""


async def _pump_guarded(
    conv: Conv,
    rt: Runtime,
    backend: Backend,
    request: ChatRequest,
    reply: ReplyStream,
    *,
    held: Held,
) -> _Streamed:
    """:func:`_pump`, and the reasoning budget guard: a reply that spent all its tokens
    (num_predict / max_tokens) thinking and wrote no answer gets one continuation with
    thinking off, in the same block, after a NOTE that says so."""
    got = await _pump(conv, rt, backend, request, reply, on_end=held.release)
    usage = got.usage
    if (
        usage is None
        or usage.done_reason != "length"
        or request.think is False
        or not reply.started  # nothing at all was written: not a thinking reply
        or got.calls
        or "".join(reply.content_parts).strip()
    ):
        return got
    spent = f"all {usage.eval_count} tokens" if usage.eval_count else "all its tokens"
    note = (
        f"the model spent {spent} of this reply thinking and wrote no answer; "
        "asked once more with thinking off"
    )
    reply._end_thinking()  # the NOTE goes after the thinking section, not inside it
    reply.note(note)
    rt.notify(conv.id, ConvEvent.NOTE, text=note)
    log.info("thinking_budget_spent", conv=conv.id, tokens=usage.eval_count)
    meta = reply.w.meta
    async with rt.scheduler(meta.backend).slot(meta.model) as again_held:  # let go of at the end
        again = await _pump(
            conv, rt, backend, replace(request, think=False), reply, on_end=again_held.release
        )
    again.truncated = again.truncated or got.truncated
    return again


@dataclass
class _Streamed:
    """What a reply's stream brought besides its text (which is already in the log)."""

    usage: Usage | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False  # cut at max_reply_bytes
    session: BackendSession | None = None  # the server-side session now holding the history


class _Pump:
    """The events of one request, applied to the reply; held in memory while the state write
    that journals the reply is not durable yet (no text may reach the log before it)."""

    def __init__(self, conv: Conv, rt: Runtime, reply: ReplyStream) -> None:
        self.rt, self.reply, self.conv_id = rt, reply, conv.id
        self.limit = rt.settings.max_reply_bytes
        self.got = _Streamed()
        self.held: list[StreamEvent] | None = []  # None once the write is durable
        self.held_bytes = 0

    async def feed_done(self, start: asyncio.Future[None]) -> None:
        """Apply the held events once ``start`` (the write they wait for) is done."""
        if self.held is not None and start.done():
            start.result()  # a failed write raises here
            await self.release()

    async def feed(self, ev: StreamEvent, start: asyncio.Future[None]) -> bool:
        """Take one event (held, or applied once ``start`` is done); True: stop reading."""
        await self.feed_done(start)
        if self.got.truncated:
            return True
        if self.held is not None:
            self.held.append(ev)
            self.held_bytes += len(ev.text)
            # enough to fill the reply: stop reading; release() then cuts it at the limit
            return self.held_bytes > self.limit
        await self._take(ev)
        return self.got.truncated

    async def release(self) -> None:
        """Apply the held events (the write is durable)."""
        held, self.held = self.held or [], None
        for ev in held:
            if self.got.truncated:
                break
            await self._take(ev)

    async def _take(self, ev: StreamEvent) -> None:
        reply, got = self.reply, self.got
        if not reply.started and ev.kind in _TEXT and ev.text and not reply.begin_reserved():
            await self.rt.committer.run(reply.begin_steps())  # the intent's writes off the loop
        if ev.kind == "tool_call" and ev.tool_call is not None:
            got.calls.append(ev.tool_call)
        elif ev.kind == "session" and ev.session is not None:
            got.session = ev.session
        got.usage = _apply(ev, reply, self.rt, self.conv_id) or got.usage
        got.truncated = reply.bytes_written > self.limit


async def _pump(
    conv: Conv,
    rt: Runtime,
    backend: Backend,
    request: ChatRequest,
    reply: ReplyStream,
    *,
    on_end: Callable[[], None],
) -> _Streamed:
    """Stream the backend's events into the reply; raises _Cancelled on the agent's cancel.

    The request goes out while the state write that says "generating" is made (it also
    journals the reply's intent, so the first text writes no state of its own). Until that
    write is durable the events are held (see :class:`_Pump`), so the stream is still read
    at the server's pace and ``on_end`` (the slot's release) runs as soon as it ends. If the
    stream ends before a committer thread has begun that write, the write is taken back and
    the reply's commit does its work too (see :meth:`ReplyStream.merge_into_commit`)."""
    pump = _Pump(conv, rt, reply)
    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
    reserved = reply.reserve()
    ended = False
    stream = backend.stream(request)
    first = asyncio.ensure_future(anext(stream, None))  # the request goes out now...
    starting = reply.w.save_steps(durable=reserved)
    start = asyncio.ensure_future(rt.committer.run(starting))
    nxt = first
    try:
        ev = await first
        while ev is not None and not await pump.feed(ev, start):
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
                if conv.cancel_flag.exists():
                    raise _Cancelled
                if not conv.dir.is_dir():
                    raise _Gone
            if pump.held and not start.done():
                # held text goes to the log the moment the write is durable, not with the
                # next event (a slow model may send that much later)
                nxt = asyncio.ensure_future(anext(stream, None))
                await asyncio.wait([nxt, start], return_when=asyncio.FIRST_COMPLETED)
                await pump.feed_done(start)
                ev = await nxt
            else:
                ev = await anext(stream, None)
        ended = True
        await stream.aclose()
        on_end()  # the server is done with this request: the slot goes on
        if not start.done() and reserved:
            # the whole reply came while the committer was busy (a burst): its commit will
            # also do what this write was for, so a turn makes one state write, not two
            reply.merge_into_commit(lambda: rt.committer.withdraw(starting))
    finally:
        if not nxt.done():
            nxt.cancel()
            await asyncio.wait([nxt])
        await stream.aclose()
        await settled(start)  # nothing else touches the files while it runs
        if not ended:
            await _flush_held(pump, start)  # what came before a failure or cancel is shown
            reply.unreserve()  # before the way out appends its marker
    start.result()
    await pump.release()
    return pump.got


async def _flush_held(pump: _Pump, start: asyncio.Future[None]) -> None:
    """On a way out (the stream failed, the agent cancelled): the text received so far goes
    into the log, as it would have without the wait, to be marked by the way out. Best
    effort: the way out's own error is the one reported."""
    if start.cancelled() or start.exception() is not None:
        return
    with contextlib.suppress(OSError, BackendError):
        await pump.release()


async def _finish(
    conv: Conv,
    rt: Runtime,
    w: ConvWriter,
    reply: ReplyStream,
    got: _Streamed,
    *,
    request: ChatRequest,
    planned: _Planned,
) -> Outcome:
    meta, usage = w.meta, got.usage
    _write_tool_calls(rt, reply, meta, got.calls)
    markers: list[tuple[MarkerKind, str]] = []
    if got.truncated:
        limit = rt.settings.max_reply_bytes
        markers.append(
            (MarkerKind.WARNING, f"the reply was cut at {limit} bytes (max_reply_bytes)")
        )
    if usage is not None:
        usage.context_window = usage.context_window or planned.window
        warning = _context_warning(usage, budget.estimate_request(request, planned.ratio))
        if warning:
            usage.context_full = True
            markers.append((MarkerKind.WARNING, warning))
        if usage.prompt_eval_count:
            rt.calibration.observe(meta.model, request.messages, usage.prompt_eval_count)
    # a reply with no NEED and no COMPLETE leaves the conversation idle: said in the same
    # state write that commits the reply
    said = "".join(reply.content_parts)
    done = not reply.saw_complete and not find_needs(said)
    status = Status.IDLE if done else None
    if not said.strip() and not got.calls:  # nothing to show for the turn: not a success
        empty = "the model returned an empty reply (no text and no tool call)"
        markers.append((MarkerKind.ERROR, empty))
        w.state.last_error = ErrorInfo(kind=ErrorKind.PROTOCOL, message=empty, time=now_iso())
        status = Status.ERROR
    if got.session is not None:  # committed with the reply: the next start goes on in it
        w.state.backend_session = got.session
    # the fsyncs of the commit run off the loop: the next conversation's request goes out
    try:
        await rt.committer.run(
            reply.finish_steps(markers=markers, usage=usage, status=status)
        )
    finally:
        if reply.committed:  # a cancel that came meanwhile finds the reply committed
            rt.guard(meta).success()
            rt.notify(conv.id, ConvEvent.REPLY, usage=usage.model_dump() if usage else None)
    return AGAIN


def _seconds(delay: float) -> str:
    return f"{delay:.1f} s" if delay < 10 else f"{delay:.0f} s"


def _write_failed(conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter, exc: OSError) -> Wait:
    """messages.log or state.json could not be written (disk full, file too large). The next
    step recovers first, as after a restart: it finds the cut reply (by its intent, or right
    after the claimed message's block) and marks it INTERRUPTED, so the turn is redone and a
    cut reply never stands as a finished one, and the claimed message is taken once."""
    seen.recovered.discard(conv.id)
    message = (
        f"writing messages.log failed ({exc.strerror or exc}); the reply will be marked "
        "interrupted and redone once the disk has room"
    )
    log.error("write_failed", conv=conv.id, error=str(exc))
    with contextlib.suppress(OSError):  # the state write may fail for the same reason
        w.record_error(ErrorKind.WRITE_FAILED, message, status=Status.ERROR)
    rt.notify(conv.id, ConvEvent.ERROR, error=message)
    return Wait(rt.clock() + rt.settings.rescan_interval)


def _apply(ev: StreamEvent, reply: ReplyStream, rt: Runtime, conv_id: str) -> Usage | None:
    if ev.kind == "content":
        reply.content(ev.text)
        rt.notify(conv_id, ConvEvent.TOKEN, text=ev.text)
    elif ev.kind == "thinking":
        reply.thinking(ev.text)
        rt.notify(conv_id, ConvEvent.THINKING, text=ev.text)
    elif ev.kind == "note":
        reply.note(ev.text)
        rt.notify(conv_id, ConvEvent.NOTE, text=ev.text)
    elif ev.kind == "done":
        return ev.usage
    return None


def _write_tool_calls(
    rt: Runtime, reply: ReplyStream, meta: Metadata, calls: list[dict[str, Any]]
) -> None:
    """Record native tool calls (or tool-call JSON the model wrote as text) as NEED lines."""
    written_as_text = False
    if not calls:
        text = "".join(reply.content_parts)
        if "NEED:" in text or '"name"' not in text:
            return
        try:
            found = rt.need_router().parse_text_tool_call(text, template=meta.template)
        except ContemplationError:
            return
        calls = [{"function": {"name": n, "arguments": a}} for n, a in found]
        written_as_text = bool(calls)
    if not calls:
        return
    try:
        functions = rt.need_router().rules(meta.template).functions()
    except ContemplationError:
        functions = {}
    lines: list[str] = []
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        name = str(fn.get("name") or "?")
        call_id = str(call.get("id") or f"call_{i}")
        rule = functions.get(name)
        args = rules.heal_arguments(fn.get("arguments"), rule.params if rule else ())
        need = rules.route_call(rule, args).need if rule else f"{name} {json.dumps(args)}"
        shown = json.dumps(args, ensure_ascii=False)
        lines.append(f"{TOOL_CALL_PREFIX}{call_id}: {name} {shown})\nNEED: {need}\n")
    if written_as_text:
        reply.note("tool calls written as JSON text were read as NEED lines")
    reply.content(("\n" if reply.content_parts else "") + "".join(lines))


def _context_warning(usage: Usage, estimate: int) -> str:
    window = usage.context_window
    if not window:
        return ""
    used = usage.prompt_eval_count or 0
    if used >= 0.98 * window or estimate > window:
        return (
            f"the prompt (~{max(used, estimate)} tokens) filled the context window ({window}); "
            "the server may have dropped the oldest messages — raise num_ctx or start a new "
            "conversation"
        )
    return ""


def _cancelled(conv: Conv, rt: Runtime, w: ConvWriter, reply: ReplyStream) -> Outcome:
    clear_cancel(conv)
    if reply.started:
        reply.abort(MarkerKind.CANCELLED, "generation stopped by the agent")
    else:
        w.append_marker(MarkerKind.CANCELLED, "the turn was cancelled by the agent")
    set_status(w, Status.CANCELLED)
    rt.notify(conv.id, ConvEvent.CANCELLED)
    return AGAIN


def _failed(
    conv: Conv, rt: Runtime, w: ConvWriter, reply: ReplyStream, exc: BackendError
) -> Outcome:
    attempt = w.state.retry_count + 1
    transient = exc.transient and attempt < rt.settings.retry.max_attempts
    guard = rt.guard(w.meta)
    if exc.transient:
        guard.failure(exc)
    elif exc.status_code is not None:
        guard.server.success()  # the server answered: it is up, the request was wrong
    if transient:
        delay = backoff(rt, attempt, exc.retry_after)
        resting = guard.resting()
        if resting is not None:  # the breaker just opened: that is when the retry comes
            delay = max(delay, resting - rt.clock())
        if reply.started:
            reply.abort(MarkerKind.INTERRUPTED, f"{exc}; retrying in {_seconds(delay)}")
        w.state.retry_count = attempt
        w.state.next_retry_at = rt.clock() + delay
        w.state.retry_settings = backend_fingerprint(rt.settings, w.meta.backend)
        w.record_error(exc.kind, str(exc), status=Status.RETRYING)
        log.warning(
            "turn_retry", conv=conv.id, error=str(exc), attempt=attempt, delay=round(delay, 2)
        )
        rt.notify(conv.id, ConvEvent.RETRYING, error=str(exc), attempt=attempt, delay=delay)
        return Wait(w.state.next_retry_at)
    message = str(exc) if exc.transient is False else f"{exc} (gave up after {attempt} attempts)"
    if reply.started:
        reply.abort(MarkerKind.ERROR, message)
    else:
        w.append_marker(MarkerKind.ERROR, message)
    w.state.retry_count = 0
    w.state.next_retry_at = None
    w.record_error(exc.kind, message, status=Status.ERROR)
    log.error("turn_failed", conv=conv.id, error=message)
    rt.notify(conv.id, ConvEvent.ERROR, error=message)
    return Wait(None)
