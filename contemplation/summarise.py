"""The one summary call a turn may make: the model's summary of the history its window
leaves out (see :func:`contemplation.budget.plan`)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

import structlog

from contemplation import budget
from contemplation.aio import on_thread
from contemplation.backends.base import Backend
from contemplation.errors import BackendError

log = structlog.get_logger("contemplation.summarise")

SUMMARY_TIMEOUT = 120.0  # seconds for the one summary call a turn may make
CHECK_INTERVAL = 0.2  # seconds between two calls of ``check`` while the summary streams


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
    request = await on_thread(functools.partial(budget.summary_request_for, fitted, think=think))
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
