"""The daemon's event loop, watched from a thread of its own: what blocks it is named.

Every conversation, the dashboard and the systemd watchdog's ping share one asyncio loop.
Code that blocks it (a plugin's ``time.sleep``, a busy loop, a synchronous HTTP call in a
backend's ``stream`` or ``capabilities``) holds all of them, and no guard on the loop can
interrupt it. :class:`LoopWatch` is a daemon thread that sees the loop's heartbeat (a callback
every :data:`BEAT` s) go stale for :data:`STALL` s and logs ``event_loop_blocked`` once, with
what the loop's thread is running: the plugin whose guarded call is on its stack (a backend's
:class:`~contemplation.backends.guard.Guarded`) and the innermost frames; then
``event_loop_resumed`` with how long it was held. It names, it does not stop: under systemd a
loop held past ``WatchdogSec`` (60 s) misses its ping and the daemon is killed and restarted,
and a turn during which that happens twice is given up (:mod:`contemplation.engine.inflight`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

import structlog

log = structlog.get_logger("contemplation.loopwatch")

BEAT = 0.25  # seconds between heartbeats
STALL = 5.0  # seconds without one: the loop is blocked
FRAMES = 3  # innermost frames named
DEPTH = 200  # frames walked at most, looking for a plugin's guarded call


class LoopWatch:
    """Watch ``loop`` (started from its own thread, the loop running) until :meth:`stop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stall: float = STALL) -> None:
        self.loop, self.stall = loop, stall
        self._last = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)

    def start(self) -> LoopWatch:
        self.loop.call_soon(self._beat)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    @contextlib.contextmanager
    def running(self) -> Iterator[LoopWatch]:
        """Watch while the block runs."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def _beat(self) -> None:
        self._last = time.monotonic()
        if not self._stopped.is_set():
            self.loop.call_later(BEAT, self._beat)

    def _watch(self) -> None:
        since: float | None = None  # the last beat before the loop was found blocked
        while not self._stopped.wait(BEAT):
            last = self._last
            if since is None and time.monotonic() - last >= self.stall:
                since = last
                log.warning(
                    "event_loop_blocked",
                    seconds=round(time.monotonic() - last, 1),
                    **running(self._loop_thread),
                )
            elif since is not None and last > since:
                log.warning("event_loop_resumed", blocked_s=round(last - since, 1))
                since = None


def running(thread: int) -> dict[str, Any]:
    """What ``thread`` runs now: the plugin whose guarded call is on its stack (if one is),
    and its innermost frames (``file:line in function``)."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return {}
    where = [
        f"{f.filename}:{f.lineno} in {f.name}"
        for f in traceback.extract_stack(frame, limit=FRAMES)[::-1]
    ]
    out: dict[str, Any] = {"running": where}
    plugin = _plugin(frame)
    if plugin:
        out["plugin"] = plugin
    return out


def _plugin(frame: FrameType | None) -> str:
    """The plugin of the innermost guarded call on the stack ("" when none is)."""
    from contemplation.backends.guard import Guarded

    for _ in range(DEPTH):
        if frame is None:
            break
        if frame.f_code.co_filename == _GUARD_FILE:
            with contextlib.suppress(Exception):  # a frame's locals, read from another thread
                owner = frame.f_locals.get("self")
                if isinstance(owner, Guarded):
                    return owner.plugin
        frame = frame.f_back
    return ""


def _guard_file() -> str:
    from contemplation.backends import guard

    return guard.__file__


_GUARD_FILE = _guard_file()
