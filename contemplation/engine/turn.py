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
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from contemplation.backends.base import Backend
from contemplation.backends.capabilities import cannot_chat, resolve_think
from contemplation.backends.providers import Target
from contemplation.base.aio import on_thread
from contemplation.engine import kvfiles, tokenized
from contemplation.engine.affinity import CopiesSlots, NamesSlots, Pinned
from contemplation.engine.retrying import (
    On,
    cancelled,
    crashed,
    failed,
    rest,
    unusable,
    write_failed,
)
from contemplation.engine.runtime import Runtime
from contemplation.engine.scheduler import Held, slot_any
from contemplation.engine.steps import AGAIN, Outcome
from contemplation.engine.tracking import Tracked
from contemplation.errors import BackendError, ContemplationError, ContextOverflow, ErrorKind
from contemplation.models import (
    BackendSession,
    Block,
    ChatRequest,
    ConvEvent,
    MarkerKind,
    Metadata,
    ReplyCut,
    Status,
)
from contemplation.needs import calls
from contemplation.prompt import budget, tokencount, truncation
from contemplation.prompt.context import saved_context
from contemplation.prompt.prompts import NeedForm, build_request, need_forms
from contemplation.prompt.reach import reach
from contemplation.prompt.summarise import summarise
from contemplation.prompt.toolspecs import canonical_tools
from contemplation.protocol import ledger, structured
from contemplation.protocol.conversation import awaiting, still_due
from contemplation.protocol.parser import find_needs
from contemplation.protocol.repetition import ReplyWatch
from contemplation.store import attachments
from contemplation.store.layout import Conv
from contemplation.store.templates import Template
from contemplation.writer import ConvWriter, LiveReply, Streamed

log = structlog.get_logger("contemplation.turn")

CANCEL_CHECK_INTERVAL = 0.2
LONG_HISTORY = 200  # blocks above which a turn's request is built and fitted on a thread
NO_NAMED_HISTORY = (
    "its turns found nothing of their history in their own slot (llama-server with -np left "
    "to its default moves idle slots out of the KV cache; give -np to keep them): the server "
    "picks each turn's slot from here on"
)


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
    vision: bool = True  # the model can see images (unknown: let the server say)
    constrains: bool = False  # every provider can hold a reply to a JSON Schema
    tokenizer: str | None = None  # a provider whose server counts tokens (llama-server)


async def run_turn(conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter) -> Outcome:
    """The model's turn, under the lock and writer of the step that decided it."""
    meta = w.meta
    target = _pinned(rt.target(meta), w.state.backend_session)
    if (stop := unusable(conv, rt, w, target.providers)) is not None:
        return stop
    guards = {p: rt.guard(p, target.model) for p in target.providers}
    usable = [p for p in target.providers if guards[p].resting() is None]
    if not usable:  # every provider rests: wait for the first to be tried again
        until = min(t for g in guards.values() if (t := g.resting()) is not None)
        return rest(rt, w, until, target)
    for name in usable:
        await rt.limits(name)  # its slots, asked once (again after it went away)
    served = meta.model_copy(
        update={"model": target.model, "options": target.options, "think": target.think}
    )
    prepared = await _prepare(conv, rt, served, usable)
    if w.state.turns == 0 and prepared.context:  # the context the daemon read, once
        w.context_read(len(prepared.context.encode()))
    # the request is built while the slots may still be busy
    planned = await _plan(conv, rt, seen, w, meta=served, prepared=prepared)
    if planned is None:
        return AGAIN
    pool = [(name, rt.scheduler(name)) for name in usable]
    asked = time.monotonic()
    async with slot_any(pool, target.model) as (provider, held):
        on = On(
            provider,
            target,
            guards[provider],
            (time.monotonic() - asked) * 1000,
            slot=await _name_slot(rt, provider, conv.id, served, held),
        )
        # checked again with the slot held: the turns queued behind a failing one must not
        # each try the server once more; one whose alias has a provider not resting goes
        # there at once instead of waiting out this one's rest
        if not on.guard.allow():
            if any(g.resting() is None for p, g in guards.items() if p != provider):
                return AGAIN
            until = on.guard.resting() or rt.clock() + 0.5
        else:
            try:
                if _grown(rt, w):  # written into while the turn waited: its request again
                    planned = await _plan(conv, rt, seen, w, meta=served, prepared=prepared)
                    if planned is None:
                        return AGAIN
                again = functools.partial(_plan, conv, rt, seen, w, meta=served, prepared=prepared)
                return await _stream(
                    conv,
                    rt,
                    seen,
                    w,
                    on=on,
                    prepared=prepared,
                    planned=planned,
                    held=held,
                    replan=again,
                )
            finally:
                on.guard.release()  # a probe that ended without a verdict lets another try
    return rest(rt, w, until, target)


def _grown(rt: Runtime, w: ConvWriter) -> bool:
    """A write landed in the claimed message's file after it was read, and the turn has not
    begun (it waited for a slot): the block is written again, whole, as the same message.
    True: the request must be built again. A write after this point is queued as a
    follow-up when the file is released (see :meth:`ConvWriter.retake`)."""
    again = False
    for path in w.changed_held():
        limit, limits = rt.settings.max_message_bytes, rt.settings.attachments
        try:
            msg = attachments.read_claimed(path, limit, limits)
        except OSError:
            continue
        if msg.text is None or msg.seen is None or msg.note:
            continue  # unreadable now: the release queues what was added
        if w.retake(path, msg.text, msg.seen):
            log.info("message_grown", conv=w.conv.id, file=path.name, bytes=msg.seen.size)
            again = True
    return again


async def _name_slot(
    rt: Runtime, provider: str, conv_id: str, meta: Metadata, held: Held
) -> int | None:
    """The server slot this turn names, where the server lets a request name one (issue 39:
    its own cache, else its template's warm prefix, copied into an unused slot where the
    server copies slots); given back with ``held``."""
    backend = rt.backend(provider)
    try:
        ids = await backend.slot_ids() if isinstance(backend, NamesSlots) else 0
    except BackendError:  # the turn itself reports what is wrong with the server
        ids = 0
    affinity = rt.affinity(provider)
    if not ids or not affinity.named:
        return None
    copier = backend if isinstance(backend, CopiesSlots) else None
    if copier is not None:
        await affinity.asked()
    prefix = f"{meta.model}\n{meta.template}"
    slot = affinity.take(conv_id, prefix, slots=ids, copy=copier is not None)
    held.then(lambda: affinity.give(slot))
    if copier is not None:
        await affinity.ready(slot, copier)
    return slot


def _backend(rt: Runtime, on: On) -> Backend:
    """The turn's provider; every request of the turn names its slot when it has one."""
    backend = rt.backend(on.provider)
    return backend if on.slot is None else Pinned(backend, on.slot)


def _pinned(target: Target, session: BackendSession | None) -> Target:
    """A conversation whose history a server holds (an OpenCode session) stays on it."""
    if session is not None and len(target.providers) > 1 and session.provider in target.providers:
        return replace(target, providers=(session.provider,))
    return target


async def _prepare(conv: Conv, rt: Runtime, meta: Metadata, usable: list[str]) -> _Prepared:
    """``meta`` as served (the alias's model, options and think); ``usable``: the providers
    the turn may land on. The request must fit the smallest window among them."""
    context = await _context(conv, rt, meta)
    found = [await rt.capabilities(name, meta.model) for name in usable]
    known = [c for c in found if c is not None]
    caps = known[0] if known else None  # None: the turn reports the error
    for c in known:  # an embedding or decision model: one ERROR, no request (issue 39)
        if (refused := cannot_chat(meta.model, c)) is not None:
            return _Prepared(context=context, error=refused)
    windows = [w for c in known if (w := c.request_window or c.context_length)]
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
            tools = canonical_tools(rt.need_router().tool_specs(template=meta.template))
        except ContemplationError:
            tools = ()
    return _Prepared(
        context=context,
        tools=tools,
        think=think,
        note=note,
        window=min(windows) if windows else None,
        vision=all(c.vision for c in known),  # (unknown: let the server say)
        constrains=all(getattr(rt.backend(p), "structured_output", False) for p in usable),
        tokenizer=next((p for p in usable if tokenized.counter([rt.backend(p)])), None),
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


def _window(options: Mapping[str, Any], known: int | None, kept: int | None) -> int:
    """The context window a request gets: its own num_ctx option, else what the backend
    says (Ollama: the num_ctx it sends; others: the model's), else a conservative 4096; never
    more than a server that cut the model's prompt was found to keep (``kept``)."""
    window = int(options.get("num_ctx") or known or 4096)
    return min(window, kept) if kept else window


async def _plan(
    conv: Conv, rt: Runtime, seen: Tracked, w: ConvWriter, *, meta: Metadata, prepared: _Prepared
) -> budget.Plan | None:
    """The turn's request, built from the log before the slot is granted (the lock is held
    since the step decided the turn, so the log cannot change meanwhile but for bytes
    appended by hand, which wait for the next step). None: no turn is due after all."""
    view = seen.view(conv, w.meta.agent_label)
    parsed = await view.refreshed(fd=w.fd)
    if not still_due(parsed.blocks, awaiting(w.state, w.meta)):
        return None
    ratio = rt.calibration.ratio(meta.model)
    blocks, first = parsed.blocks, 0
    if view.bare_count:  # a long log: the newest blocks' text read back, as far as needed
        window = _window(meta.options, prepared.window, rt.calibration.kept.get(meta.model))
        blocks, first = await on_thread(lambda: reach(view, parsed.blocks, window, ratio))
    blind = ""
    if not prepared.vision:  # older images left out, said once (its own message's: an ERROR)
        blocks, blind = attachments.blind(blocks, meta.model)
    tpl = rt.template(meta.template) if meta.template else None
    spec = structured.spec_for(blocks, tpl.schema if tpl else None)
    fit = functools.partial(
        _fitted,
        meta,
        blocks,
        first=first,
        template=tpl,
        needs=_offered(rt, meta),
        spec=spec,
        prepared=prepared,
        session=w.state.backend_session,
        ratio=ratio,
        kept=rt.calibration.kept.get(meta.model),
    )
    # pure work in proportion to the history (~10 µs a block): a long one is fitted on a
    # thread, not on the loop (5,500 blocks took ~100 ms)
    plan = await on_thread(fit) if len(blocks) - first > LONG_HISTORY else fit()
    if prepared.tokenizer is not None:  # the estimate checked against the server's count
        note = await tokenized.calibrate(
            rt.calibration,
            rt.backend(prepared.tokenizer),
            meta.model,
            plan.request,
            plan.window,
            now=rt.steady(),
        )
        if note is not None:
            ratio = rt.calibration.ratio(meta.model)
            fit = functools.partial(fit, ratio=ratio)
            plan = await on_thread(fit) if len(blocks) - first > LONG_HISTORY else fit()
            if not tokencount.noted(parsed.blocks, meta.model):  # said once a conversation
                plan = replace(plan, notes=(note, *plan.notes))
    return replace(plan, notes=(blind, *plan.notes)) if blind else plan


def _fitted(
    meta: Metadata,
    blocks: tuple[Block, ...],
    *,
    template: Template | None,
    needs: tuple[NeedForm, ...] | None,
    prepared: _Prepared,
    session: BackendSession | None,
    ratio: float,
    spec: structured.Spec | None = None,
    first: int = 0,
    kept: int | None = None,
) -> budget.Plan:
    """The request built from ``blocks[first:]`` (the older ones may be bare: see
    :mod:`contemplation.prompt.reach`) and fitted to the window (pure: runs on a thread). A reply
    held to a schema (``spec``) is offered no NEED lines and no tools."""
    request = build_request(
        meta,
        blocks[first:],
        template_prompt=template.system_prompt if template else "",
        prompt_mode=template.prompt_mode if template else "add",
        needs=needs,
        context=prepared.context,
        asking=spec is None,
    )
    request = replace(  # session: what the server already holds of the history (OpenCode)
        request, tools=() if spec else prepared.tools, think=prepared.think, session=session
    )
    if spec is not None:
        request = structured.shape(request, spec, constrains=prepared.constrains)
    window = _window(request.options, prepared.window, kept)
    reserve = budget.reply_reserve(window, request.options)
    return budget.plan(request, window, blocks=blocks, reserve=reserve, ratio=ratio, first=first)


async def _stream(
    conv: Conv,
    rt: Runtime,
    seen: Tracked,
    w: ConvWriter,
    *,
    on: On,
    prepared: _Prepared,
    planned: budget.Plan,
    held: Held,
    replan: Callable[[], Awaitable[budget.Plan | None]] | None = None,
) -> Outcome:
    w.generating(rt.clock())  # status shows who holds the slot, since when
    rt.notify(conv.id, ConvEvent.GENERATING, model=on.model, provider=on.provider)
    reply = w.live_reply(
        rt.committer,
        limit=rt.settings.max_reply_bytes,
        on_event=lambda kind, text: rt.notify(conv.id, kind, text=text),
    )
    error = prepared.error or attachments.vision_error(planned.request, prepared.vision, on.model)
    if error is not None:
        return failed(conv, rt, w, reply, error, on=on)
    if prepared.note:
        await reply.note(prepared.note)
    return await _run_reply(
        conv, rt, w, seen=seen, on=on, reply=reply, planned=planned, held=held, replan=replan
    )


async def _run_reply(
    conv: Conv,
    rt: Runtime,
    w: ConvWriter,
    *,
    seen: Tracked,
    on: On,
    reply: LiveReply,
    planned: budget.Plan,
    held: Held,
    replan: Callable[[], Awaitable[budget.Plan | None]] | None = None,
) -> Outcome:
    """Fit the request (a summary call at most), stream the reply and end it one of six
    ways: finished, cancelled, interrupted by a stop, failed (retry or error), cut by a
    failed write (redone once the disk has room), or crashed (redone once)."""
    try:
        try:
            request, notes = await _fit(conv, rt, on, reply, planned)
            if attachments.carries_images(request):  # the images' bytes, read off the loop
                kept = conv.dir / attachments.FOLDER
                request = await on_thread(functools.partial(attachments.load_images, kept, request))
            for note in notes:
                await reply.note(note)
            got, planned, request = await _pump_refitted(
                conv,
                rt,
                on=on,
                reply=reply,
                planned=planned,
                request=request,
                held=held,
                replan=replan,
            )
        finally:
            held.release()  # the server is done with it: the commit below needs no slot
    except _Cancelled:
        return cancelled(conv, rt, w, reply)
    except _Gone:  # the stream is closed; there is no folder left to write the outcome in
        log.warning("conversation_removed", conv=conv.id, during="a reply")
        return AGAIN
    except asyncio.CancelledError:
        if conv.id in seen.cancelled:
            seen.cancelled.discard(conv.id)
            return cancelled(conv, rt, w, reply)
        reply.abort(
            MarkerKind.INTERRUPTED, "the daemon stopped during this reply; it will be redone"
        )
        w.show(Status.PENDING)
        raise
    except BackendError as exc:
        if exc.kind == "cancelled":  # the server aborted the turn at our request
            return cancelled(conv, rt, w, reply)
        return failed(conv, rt, w, reply, exc, on=on)
    except OSError as exc:
        return write_failed(conv, rt, seen, w, exc)
    except Exception as exc:  # unexpected: redone once, never at every rescan
        return crashed(conv, rt, w, reply, exc)
    return await _end(conv, rt, seen, w, reply, got=got, on=on, request=request, planned=planned)


async def _end(
    conv: Conv,
    rt: Runtime,
    seen: Tracked,
    w: ConvWriter,
    reply: LiveReply,
    *,
    got: Streamed,
    on: On,
    request: ChatRequest,
    planned: budget.Plan,
) -> Outcome:
    """:func:`_finish`, and how it ends when it fails: a failed write, or a crash."""
    try:
        return await _finish(conv, rt, w, reply, got, on=on, request=request, planned=planned)
    except OSError as exc:
        return write_failed(conv, rt, seen, w, exc)
    except Exception as exc:  # unexpected (a reply no code was ready for): redone once
        return crashed(conv, rt, w, reply, exc)


def _check_cancel(conv: Conv) -> None:
    """Raise _Cancelled when the agent asked to cancel the turn."""
    if conv.cancel_flag.exists():
        raise _Cancelled


async def _fit(
    conv: Conv, rt: Runtime, on: On, reply: LiveReply, fitted: budget.Plan
) -> tuple[ChatRequest, list[str]]:
    """The request that fits the window, and the NOTEs that say how. When the plan asks for
    a summary this is the turn's one summary call; if it fails, the oldest turns are left
    out. Raises _Cancelled on the agent's cancel."""
    if not fitted.summarise:
        return fitted.request, list(fitted.notes)
    blind = [n for n in fitted.notes if attachments.is_blind_note(n)]  # the summary's own
    await reply.save()  # says generating while it is made
    caps = await rt.capabilities(on.provider, on.model)
    text, why = await summarise(
        _backend(rt, on),
        fitted,
        think=False if caps is not None and caps.thinking else None,
        check=functools.partial(_check_cancel, conv),
        conv_id=conv.id,
    )
    request, notes = fitted.with_summary(text) if text else fitted.without_summary(why)
    return request, [*blind, *notes]


async def _pump_refitted(
    conv: Conv,
    rt: Runtime,
    *,
    on: On,
    reply: LiveReply,
    planned: budget.Plan,
    request: ChatRequest,
    held: Held,
    replan: Callable[[], Awaitable[budget.Plan | None]] | None,
) -> tuple[Streamed, budget.Plan, ChatRequest]:
    """:func:`_pump_guarded`; a prompt the server refuses for its window, saying how many
    tokens it counted, is compacted once and sent again (:func:`_refused`)."""
    request = capped(request, planned.window, rt.settings.reply_cap)
    try:
        return await _pump_guarded(conv, rt, on, request, reply, held=held), planned, request
    except ContextOverflow as exc:
        if replan is None or reply.started or not exc.n_prompt:
            raise
        planned, request = await _refused(
            conv, rt, on=on, reply=reply, exc=exc, request=request, replan=replan
        )
        request = capped(request, planned.window, rt.settings.reply_cap)
        return await _pump_guarded(conv, rt, on, request, reply, held=held), planned, request


async def _refused(
    conv: Conv,
    rt: Runtime,
    *,
    on: On,
    reply: LiveReply,
    exc: ContextOverflow,
    request: ChatRequest,
    replan: Callable[[], Awaitable[budget.Plan | None]],
) -> tuple[budget.Plan, ChatRequest]:
    """The server refused ``request`` for its window and said how many tokens it counted
    (never a reply built on a cut prompt): the model's ratio takes the server's count, the
    request is planned again (compacted: a summary call at most) and a NOTE says so. Raises
    ``exc`` when nothing is due any more."""
    estimated = budget.estimate_request(request, rt.calibration.ratio(on.model))
    rt.calibration.refused(on.model, request, exc.n_prompt or 0)
    planned = await replan()
    if planned is None:
        raise exc
    await reply.note(
        f"the server counted {exc.n_prompt} prompt tokens for a window of {exc.n_ctx} "
        f"(estimated ~{estimated}): the request was compacted and sent again"
    )
    log.info("context_refused", conv=conv.id, counted=exc.n_prompt, n_ctx=exc.n_ctx)
    request, notes = await _fit(conv, rt, on, reply, planned)
    if attachments.carries_images(request):
        kept = conv.dir / attachments.FOLDER
        request = await on_thread(functools.partial(attachments.load_images, kept, request))
    for note in notes:
        await reply.note(note)
    return planned, request


async def _pump_guarded(
    conv: Conv,
    rt: Runtime,
    on: On,
    request: ChatRequest,
    reply: LiveReply,
    *,
    held: Held,
) -> Streamed:
    """:func:`_pump`, and the reasoning budget guard: a reply that spent all its tokens
    (num_predict / max_tokens) thinking and wrote no answer gets one continuation with
    thinking off, in the same block, after a NOTE that says so."""
    backend = _backend(rt, on)
    watch = ReplyWatch() if rt.settings.stop_repeating else None
    got = await _pump(conv, backend, request, reply, on_end=held.release, watch=watch)
    usage = got.usage
    if (
        usage is None
        or usage.done_reason != "length"
        or request.think is False
        or not reply.started  # nothing at all was written: not a thinking reply
        or got.calls
        or reply.text.strip()
    ):
        return got
    spent = f"all {usage.eval_count} tokens" if usage.eval_count else "all its tokens"
    await reply.note(
        f"the model spent {spent} of this reply thinking and wrote no answer; "
        "asked once more with thinking off"
    )
    log.info("thinking_budget_spent", conv=conv.id, tokens=usage.eval_count)
    async with rt.scheduler(on.provider).slot(on.model) as again_held:  # let go of at the end
        again = await _pump(
            conv,
            backend,
            replace(request, think=False),
            reply,
            on_end=again_held.release,
            watch=watch,
        )
    again.truncated = again.truncated or got.truncated
    return again


async def _pump(
    conv: Conv,
    backend: Backend,
    request: ChatRequest,
    reply: LiveReply,
    *,
    on_end: Callable[[], None],
    watch: ReplyWatch | None = None,
) -> Streamed:
    """Read the backend's stream into the reply (which makes it durable, see
    :meth:`LiveReply.attempt`); raises _Cancelled on the agent's cancel, _Gone when the
    folder is deleted. The request goes out first, while the reply's first state write is
    made; ``on_end`` (the slot's release) runs as soon as the stream ends. A reply ``watch``
    sees stuck in a loop is stopped there: the stream is closed (the server stops generating)
    and what was said is kept (``Streamed.repeating`` says what repeated)."""
    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
    stream = backend.stream(request)
    first = asyncio.ensure_future(anext(stream, None))  # the request goes out now...
    async with reply.attempt() as feed:  # ...while the write that journals the reply is made
        nxt = first
        try:
            ev = await first
            while ev is not None and not await feed.take(ev):
                if watch is not None and (loop := watch.feed(ev.kind, ev.text)) is not None:
                    feed.got.repeating = loop.describe()
                    break
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CANCEL_CHECK_INTERVAL
                    _check_cancel(conv)
                    if not conv.dir.is_dir():
                        raise _Gone
                if feed.holding:
                    nxt = asyncio.ensure_future(anext(stream, None))
                    await feed.durable_or(nxt)
                    ev = await nxt
                else:
                    ev = await anext(stream, None)
            await stream.aclose()
            on_end()  # the server is done with this request: the slot goes on
        finally:
            if not nxt.done():
                nxt.cancel()
                await asyncio.wait([nxt])
            await stream.aclose()
    return feed.got


async def _finish(
    conv: Conv,
    rt: Runtime,
    w: ConvWriter,
    reply: LiveReply,
    got: Streamed,
    *,
    on: On,
    request: ChatRequest,
    planned: budget.Plan,
) -> Outcome:
    meta, usage = w.meta, got.usage
    if request.schema is None:  # a reply held to a schema is offered no tools: it is the answer
        await _write_tool_calls(rt, reply, meta, got.calls)
    # a reply stopped before its end says so on every face (state.json reply_cut)
    markers, ended = _ending(conv.id, got, request, rt.settings.max_reply_bytes)
    if usage is not None:
        usage.queued_ms, usage.provider, usage.model = on.queued_ms, on.provider, on.model
        usage.context_window = usage.context_window or planned.window
        affinity = rt.affinity(on.provider)  # a server that keeps no named slot's history:
        if on.slot is not None and affinity.observed(on.slot, conv.id, usage.cached_tokens):
            log.warning("slots_not_named", provider=on.provider, why=NO_NAMED_HISTORY)  # it picks
        restored = affinity.verified(  # a slot file restored: held?
            on.slot, conv.id, usage.cached_tokens, usage.prompt_eval_count,
            kvfiles.digest(request.messages),
        )  # fmt: skip
        kvfiles.said(on.provider, conv.id, restored)
        last = rt.calibration.counts.last(conv.id)  # (before the check keeps this one's)
        # the server counted clearly fewer tokens than our count of what was sent: it cut it
        cut = truncation.check(rt.calibration.counts, conv.id, usage, request, planned.ratio)
        usage.miss = ledger.miss(  # why it recomputed what it held, where it did
            usage, held=last.tokens if last else None,
            extends=last is not None and truncation.extends(request, last),
            same_tools=last is None or truncation.same_tools(request, last),
            compacted=bool(planned.summarise or planned.notes), cut=bool(cut),
            restore=restored, first=w.state.turns == 0,
        )  # fmt: skip
        if cut and (counted := truncation.whole_count(usage)):  # fitted to that from now on
            kept = rt.calibration.cut(on.model, counted)
            cut += f"; the next requests to {on.model} are fitted to the {kept} tokens it kept"
        estimate = budget.estimate_request(request, planned.ratio)
        warning = cut or budget.context_warning(usage, estimate)
        if warning:
            usage.context_full = True
            markers.append((MarkerKind.WARNING, warning))
        if cut:  # its count is of what was left: never learnt (see truncation.py)
            log.warning("prompt_cut", conv=conv.id, model=on.model, why=cut)
        elif usage.prompt_eval_count:
            rt.calibration.observe(on.model, request.messages, usage.prompt_eval_count)
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
    return AGAIN


async def _write_tool_calls(
    rt: Runtime, reply: LiveReply, meta: Metadata, native: list[dict[str, Any]]
) -> None:
    """Record native tool calls (or tool-call JSON the model wrote as text) as NEED lines."""
    if not native and not calls.may_hold_calls(reply.text):
        return  # the common case: no call, and no JSON that could be one
    try:
        functions = rt.need_router().rules(meta.template).functions()
    except ContemplationError:
        functions = {}
    found = native or calls.calls_in_text(reply.text, functions)
    if not found:
        return
    if not native:
        await reply.note("tool calls written as JSON text were read as NEED lines")
    reply.content(("\n" if reply.text else "") + calls.need_lines(found, functions))


def capped(request: ChatRequest, window: int, share: float) -> ChatRequest:
    """``request`` with the default reply cap: ``share`` of the window in ``num_predict``
    when its options set none (``num_predict`` or ``max_tokens``; -1 is Ollama's "no cap")."""
    options = request.options
    if share <= 0 or window <= 0 or "num_predict" in options or "max_tokens" in options:
        return request
    return replace(request, options={**options, "num_predict": max(1, int(window * share))})


def _ending(
    conv_id: str, got: Streamed, request: ChatRequest, limit: int
) -> tuple[list[tuple[MarkerKind, str]], ReplyCut | None]:
    """The markers that say how the reply ended early, and the ``reply_cut`` it records."""
    markers: list[tuple[MarkerKind, str]] = []
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
