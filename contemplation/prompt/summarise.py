"""The one summary call a turn may make: the model's summary of the history its window
leaves out (see :func:`contemplation.prompt.budget.plan`)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from contemplation.backends.base import Backend
from contemplation.base.aio import on_thread
from contemplation.errors import BackendError
from contemplation.models import ChatMessage, ChatRequest, Usage
from contemplation.prompt import budget

log = structlog.get_logger("contemplation.summarise")

SUMMARY_TIMEOUT = 120.0  # seconds for the one summary call a turn may make
CHECK_INTERVAL = 0.2  # seconds between two calls of ``check`` while the summary streams
SUMMARY_ASK = (
    "Summarise the conversation above in at most {words} words, the summary of its earlier "
    "part included if there is one: facts, decisions, open questions. Write only the summary."
)
REST_HEAD = "The rest of the conversation, after the part above (long messages cut):"


def cached_request(fitted: budget.Plan, *, think: bool | None) -> ChatRequest | None:
    """The summary call as the conversation's own prompt plus one final instruction: the
    system prompt (with the summary it extends, as the turns before sent it) and the
    messages to summarise, as the server holds them from the turns before, so that it reuses
    its cache and prefills only the instruction. The summary is bounded to a share
    of the window (:func:`budget.summary_tokens`, sent as ``num_predict``).

    A turn compacts while this fits (:func:`budget.compact_at`). Where it still does not (a
    turn longer than the room left), the prompt is the longest run of those messages that
    fits, and the instruction carries the rest as a transcript cut to the room left: still
    the slot's own prefix, never a prompt of its own that replaces the conversation's cache.
    None only without a window or anything to summarise."""
    if not fitted.summarise or not fitted.window:
        return None
    system = list(fitted.system)
    if fitted.previous:
        system = budget.with_summary(system, budget.cap_summary(fitted.previous))
    bound = budget.summary_tokens(fitted.window)
    text = SUMMARY_ASK.format(words=budget.summary_words(fitted.window))
    tools = fitted.request.tools
    room = fitted.window - bound - budget.estimate((), fitted.ratio, tools)
    ask = ChatMessage("user", text)
    messages = [*system, *fitted.summarise, ask]
    if budget.estimate(messages, fitted.ratio) > room:
        messages = _with_rest(fitted, system, text, room)
    options = {k: v for k, v in fitted.request.options.items() if k != "num_predict"}
    options["num_predict"] = bound
    return ChatRequest(
        model=fitted.request.model,
        messages=tuple(messages),
        options=options,
        think=think,
        tools=tools,
    )


def _with_rest(
    fitted: budget.Plan, system: list[ChatMessage], text: str, room: int
) -> list[ChatMessage]:
    """The system prompt and the longest run of ``fitted.summarise`` that fills at most half
    of ``room``, then the instruction with the rest as a transcript in the room left."""
    ratio = fitted.ratio
    used = budget.estimate(system, ratio) + budget.message_tokens(
        ChatMessage("user", f"{text}\n\n{REST_HEAD}\n\n"), ratio
    )
    k = 0
    for m in fitted.summarise:
        cost = budget.message_tokens(m, ratio)
        if used + cost > room // 2:
            break
        used += cost
        k += 1
    rest = replace(fitted, summarise=fitted.summarise[k:], previous=None, unseen=0)
    transcript = budget.transcript(rest, room - used)
    ask = ChatMessage("user", f"{text}\n\n{REST_HEAD}\n\n{transcript}")
    return [*system, *fitted.summarise[:k], ask]


async def summarise(
    backend: Backend,
    fitted: budget.Plan,
    *,
    think: bool | None,
    check: Callable[[], None],
    conv_id: str = "",
    counted: Callable[[Usage], None] | None = None,
) -> tuple[str, str]:
    """The model's summary of what ``fitted`` leaves out, or "" and why there is none. One
    call, at most SUMMARY_TIMEOUT seconds and budget.summary_tokens(window) tokens; ``check``
    is called every CHECK_INTERVAL seconds while it streams (it raises to stop: a cancel).
    ``counted`` is given the call's usage, where the server said it (the ledger's row)."""
    # what is left out is the long part of a long history: made on a thread
    request = await on_thread(functools.partial(cached_request, fitted, think=think))
    if request is None:
        return "", "nothing to summarise"
    parts: list[str] = []
    next_check = time.monotonic() + CHECK_INTERVAL
    try:
        async with asyncio.timeout(SUMMARY_TIMEOUT):
            stream = backend.stream(request)
            try:
                async for ev in stream:
                    if ev.kind == "content":
                        parts.append(ev.text)
                    elif ev.kind == "done" and ev.usage is not None and counted is not None:
                        counted(ev.usage)
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + CHECK_INTERVAL
                        check()
            finally:
                await stream.aclose()
    except TimeoutError:
        return "", f"no answer within {SUMMARY_TIMEOUT:g} s"
    except BackendError as exc:
        return "", str(exc)
    text = "".join(parts).strip()
    if not text:
        return "", "the model wrote no summary"
    log.info("history_summarised", conv=conv_id, messages=len(fitted.summarise))
    return text, ""
