"""The turn's request, fitted to the model's window: planned from the log before the slot
(:func:`plan`), its summary call made with the slot held (:func:`fit`), compacted once more
when the server refuses it for its window (:func:`refused`), its reply capped (:func:`capped`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from contemplation.backends.base import Backend
from contemplation.base.aio import on_thread
from contemplation.engine import tokenized
from contemplation.engine.runtime import Runtime
from contemplation.engine.turn.state import Attempt, On, Prepared, Turn
from contemplation.errors import ContemplationError, ContextOverflow
from contemplation.models import BackendSession, Block, ChatRequest, Metadata
from contemplation.prompt import budget, tokencount
from contemplation.prompt.prompts import NeedForm, build_request, need_forms
from contemplation.prompt.reach import reach
from contemplation.prompt.summarise import summarise
from contemplation.protocol import panel, structured
from contemplation.protocol.conversation import awaiting, next_action
from contemplation.protocol.panel import seated
from contemplation.store import attachments
from contemplation.store.templates import Template

log = structlog.get_logger("contemplation.turn")

LONG_HISTORY = 200  # blocks above which a turn's request is built and fitted on a thread


@dataclass(frozen=True, slots=True)
class History:
    """What a request is built from: ``blocks[first:]`` (the older ones may be bare: see
    :mod:`contemplation.prompt.reach`), the conversation's template, the NEED forms offered, a
    schema the reply is held to (``spec``), what a server already holds of the history
    (``session``, OpenCode) and the tokens a server that cut a prompt was found to keep."""

    blocks: tuple[Block, ...]
    first: int = 0
    template: Template | None = None
    needs: tuple[NeedForm, ...] | None = None
    spec: structured.Spec | None = None
    session: BackendSession | None = None
    kept: int | None = None


def offered(rt: Runtime, meta: Metadata) -> tuple[NeedForm, ...] | None:
    """The NEED forms the system prompt offers: those a rule answers with a tool that is set
    up (None when the rules cannot be built: the built-in forms)."""
    try:
        return need_forms(rt.need_router().offered(meta.template))
    except ContemplationError:
        return None


def backend(on: On) -> Backend:
    """The turn's provider's client; every request of the turn names its slot when it has
    one."""
    return on.host.pinned(on.slot)


def window(options: Mapping[str, Any], known: int | None, kept: int | None) -> int:
    """The context window a request gets: its own num_ctx option, else what the backend
    says (Ollama: the num_ctx it sends; others: the model's), else a conservative 4096; never
    more than a server that cut the model's prompt was found to keep (``kept``)."""
    got = int(options.get("num_ctx") or known or 4096)
    return min(got, kept) if kept else got


async def plan(
    turn: Turn, prepared: Prepared, *, seat: Metadata | None = None
) -> budget.Plan | None:
    """The turn's request, built from the log before the slot is granted (the lock is held
    since the step decided the turn, so the log cannot change meanwhile but for bytes
    appended by hand, which wait for the next step). None: no turn is due after all.
    ``seat``: another seat of the panel, asked ahead (:mod:`.ahead`): the request its own
    turn will build, when its thread wants a turn."""
    conv, rt, w, meta = turn.conv, turn.rt, turn.w, prepared.meta
    view = turn.seen.view(conv, w.meta.agent_label)
    parsed = await view.refreshed(fd=w.fd)
    label: str | None = None
    if seat is None:
        due = seated(w.meta, parsed.blocks, awaiting(w.state, w.meta))
        if due.nxt.action != "turn" or due.meta.sender_label() != w.meta.sender_label():
            return None  # answered or cancelled meanwhile, or another seat of a panel is due
        label = due.seat
    else:
        label = seat.model_label
        seen = panel.view(seat, parsed.blocks, label)
        if next_action(seen, awaiting(w.state, seat)).action != "turn":
            return None
    ratio = rt.calibration.ratio(meta.model)
    blocks, first = parsed.blocks, 0
    kept = rt.calibration.kept.get(meta.model)
    if view.bare_count:  # a long log: the newest blocks' text read back, as far as needed
        wanted = window(meta.options, prepared.window, kept)
        blocks, first = await on_thread(lambda: reach(view, parsed.blocks, wanted, ratio))
    if label is not None:  # a panel's seat: its own thread of the log
        blocks, first = _seat_view(seat or w.meta, blocks, first, label)
    blind = ""
    if not prepared.vision:  # older images left out, said once (its own message's: an ERROR)
        blocks, blind = attachments.blind(blocks, meta.model)
    tpl = rt.template(meta.template) if meta.template else None
    history = History(
        blocks,
        first=first,
        template=tpl,
        needs=offered(rt, meta),
        spec=structured.spec_for(blocks, tpl.schema if tpl else None),
        session=None if label else w.state.backend_session,  # a server session is one seat's
        kept=kept,
    )
    fit_it = functools.partial(fitted, prepared, history)
    # pure work in proportion to the history (~10 µs a block): a long one is fitted on a
    # thread, not on the loop (5,500 blocks took ~100 ms)
    off_loop = len(blocks) - first > LONG_HISTORY
    got = await on_thread(functools.partial(fit_it, ratio)) if off_loop else fit_it(ratio)
    if prepared.tokenizer is not None:  # the estimate checked against the server's count
        note = await tokenized.calibrate(
            rt.calibration,
            prepared.tokenizer.backend,
            meta.model,
            got.request,
            got.window,
            now=rt.steady(),
        )
        if note is not None:
            ratio = rt.calibration.ratio(meta.model)
            got = await on_thread(functools.partial(fit_it, ratio)) if off_loop else fit_it(ratio)
            if not tokencount.noted(parsed.blocks, meta.model):  # said once a conversation
                got = replace(got, notes=(note, *got.notes))
    return replace(got, notes=(blind, *got.notes)) if blind else got


def _seat_view(
    meta: Metadata, blocks: tuple[Block, ...], first: int, seat: str
) -> tuple[tuple[Block, ...], int]:
    """What a panel's seat sees of ``blocks`` (:func:`panel.view`), and where the part
    read back (``blocks[first:]``) begins in it."""
    since = blocks[first].offset if first < len(blocks) else None
    seen = panel.view(meta, blocks, seat)
    if since is None:
        return seen, len(seen)
    return seen, next((i for i, b in enumerate(seen) if b.offset >= since), len(seen))


def fitted(prepared: Prepared, history: History, ratio: float) -> budget.Plan:
    """The request built from the history and fitted to the window (pure: runs on a
    thread). A reply held to a schema (``spec``) is offered no NEED lines and no tools."""
    tpl, spec, first = history.template, history.spec, history.first
    request = build_request(
        prepared.meta,
        history.blocks[first:],
        template_prompt=tpl.system_prompt if tpl else "",
        prompt_mode=tpl.prompt_mode if tpl else "add",
        needs=history.needs,
        context=prepared.context,
        asking=spec is None and prepared.asking,
    )
    request = replace(  # session: what the server already holds of the history (OpenCode)
        request,
        tools=() if spec or not prepared.asking else prepared.tools,
        think=prepared.think,
        session=history.session,
    )
    if spec is not None:
        request = structured.shape(request, spec, constrains=prepared.constrains)
    got = window(request.options, prepared.window, history.kept)
    reserve = budget.reply_reserve(got, request.options)
    return budget.plan(
        request, got, blocks=history.blocks, reserve=reserve, ratio=ratio, first=first
    )


async def fit(at: Attempt, fitted_plan: budget.Plan) -> tuple[ChatRequest, list[str]]:
    """The request that fits the window, and the NOTEs that say how. When the plan asks for
    a summary this is the turn's one summary call; if it fails, the oldest turns are left
    out. Raises Cancelled on the agent's cancel."""
    if not fitted_plan.summarise:
        return fitted_plan.request, list(fitted_plan.notes)
    blind = [n for n in fitted_plan.notes if attachments.is_blind_note(n)]  # the summary's own
    await at.reply.save()  # says generating while it is made
    caps = await at.on.host.capabilities(at.on.model)
    text, why = await summarise(
        backend(at.on),
        fitted_plan,
        think=False if caps is not None and caps.thinking else None,
        check=at.turn.check_cancel,
        conv_id=at.conv.id,
        counted=functools.partial(at.w.count_summary, provider=at.on.provider, model=at.on.model),
    )
    request, notes = fitted_plan.with_summary(text) if text else fitted_plan.without_summary(why)
    return request, [*blind, *notes]


async def with_images(at: Attempt, request: ChatRequest) -> ChatRequest:
    """``request`` with its images' bytes, read off the loop."""
    if not attachments.carries_images(request):
        return request
    kept = at.conv.dir / attachments.FOLDER
    return await on_thread(functools.partial(attachments.load_images, kept, request))


async def refused(
    at: Attempt, exc: ContextOverflow, request: ChatRequest
) -> tuple[budget.Plan, ChatRequest]:
    """The server refused ``request`` for its window and said how many tokens it counted
    (never a reply built on a cut prompt): the model's ratio takes the server's count, the
    request is planned again (compacted: a summary call at most) and a NOTE says so. Raises
    ``exc`` when nothing is due any more."""
    rt, on, reply = at.rt, at.on, at.reply
    estimated = budget.estimate_request(request, rt.calibration.ratio(on.model))
    rt.calibration.refused(on.model, request, exc.n_prompt or 0)
    planned = await plan(at.turn, at.prepared)
    if planned is None:
        raise exc
    await reply.note(
        f"the server counted {exc.n_prompt} prompt tokens for a window of {exc.n_ctx} "
        f"(estimated ~{estimated}): the request was compacted and sent again"
    )
    log.info("context_refused", conv=at.conv.id, counted=exc.n_prompt, n_ctx=exc.n_ctx)
    request, notes = await fit(at, planned)
    request = await with_images(at, request)
    for note in notes:
        await reply.note(note)
    return planned, request


def capped(request: ChatRequest, window: int, share: float) -> ChatRequest:
    """``request`` with the default reply cap: ``share`` of the window in ``num_predict``
    when its options set none (``num_predict`` or ``max_tokens``; -1 is Ollama's "no cap")."""
    options = request.options
    if share <= 0 or window <= 0 or "num_predict" in options or "max_tokens" in options:
        return request
    return replace(request, options={**options, "num_predict": max(1, int(window * share))})
