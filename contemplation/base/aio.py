"""Awaiting work that must run to its end even when the awaiting task is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def settled(fut: asyncio.Future[Any]) -> None:
    """Wait until ``fut`` is done, even through a cancel (re-raised once it is)."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def on_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on the default executor's thread, awaited to its end: a cancel waits for it
    (then is re-raised), so what ``fn`` reads (an open descriptor, say) outlives it."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn)
    await settled(fut)
    return fut.result()
