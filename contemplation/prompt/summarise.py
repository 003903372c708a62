"""The one summary call a turn may make: the model's summary of the history its window
leaves out (see :func:`contemplation.prompt.budget.plan`)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

import structlog

from contemplation.backends.base import Backend
from contemplation.base.aio import on_thread
from contemplation.errors import BackendError
from contemplation.models import ChatMessage, ChatRequest
from contemplation.prompt import budget

log = structlog.get_logger("contemplation.summarise")

SUMMARY_TIMEOUT = 120.0  # seconds for the one summary call a turn may make
CHECK_INTERVAL = 0.2  # seconds between two calls of ``check`` while the summary streams
SUMMARY_ASK = (
    "Summarise the conversation above in at most {words} words, the summary of its earlier "
    "part included if there is one. Keep facts, decisions, open questions and the answers to "
    "requests for context; leave out pleasantries. Write only the summary."
)


def cached_request(fitted: budget.Plan, *, think: bool | None) -> ChatRequest | None:
    """The summary call as the conversation's own prompt plus one final instruction: the
    system prompt (with the summary it extends, as the turns before sent it) and the
    messages to summarise, as the server holds them from the turns before, so that it reuses
    its cache and prefills only the instruction (issue 39). None when that does not fit the
    window: :func:`budget.summary_request_for` makes a transcript of it instead."""
    system = list(fitted.system)
    if fitted.previous:
        system = budget.with_summary(system, budget.cap_summary(fitted.previous))
    ask = ChatMessage("user", SUMMARY_ASK.format(words=budget.SUMMARY_MAX_WORDS))
    messages = (*system, *fitted.summarise, ask)
    tools = fitted.request.tools
    if not fitted.summarise or not fitted.window:
        return None
    room = fitted.window - budget.SUMMARY_MAX_TOKENS
    if budget.estimate(messages, fitted.ratio, tools) > room:
        return None
    options = {k: v for k, v in fitted.request.options.items() if k != "num_predict"}
    options["num_predict"] = budget.SUMMARY_MAX_TOKENS
    return ChatRequest(
        model=fitted.request.model,
        messages=messages,
        options=options,
        think=think,
        tools=tools,
    )


async def summarise(
    backend: Backend,
    fitted: budget.Plan,
    *,
    think: bool | None,
    check: Callable[[], None],
    conv_id: str = "",
) -> tuple[str, str]:
    """The model's summary of what ``fitted`` leaves out, or "" and why there is none. One
    call, at most SUMMARY_TIMEOUT seconds and budget.SUMMARY_MAX_TOKENS tokens; ``check``
    is called every CHECK_INTERVAL seconds while it streams (it raises to stop: a cancel)."""
    # what is left out is the long part of a long history: made on a thread
    request = cached_request(fitted, think=think)
    if request is None:
        request = await on_thread(
            functools.partial(budget.summary_request_for, fitted, think=think)
        )
    parts: list[str] = []
    next_check = time.monotonic() + CHECK_INTERVAL
    try:
        async with asyncio.timeout(SUMMARY_TIMEOUT):
            stream = backend.stream(request)
            try:
                async for ev in stream:
                    if ev.kind == "content":
                        parts.append(ev.text)
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
