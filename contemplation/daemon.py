"""Composition root: build settings, runtime, watcher and dispatcher; run; stop on a signal.

It holds no logic of its own. The lifecycle reads like a script:
lock the home → recover and scan everything → watch → tick (rescan, watchdog) until a
signal → stop taking work → let in-flight turns finish within the grace period → close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from contemplation import sdnotify
from contemplation.dispatcher import Dispatcher
from contemplation.layout import Home, list_conversations
from contemplation.limits import raise_fd_limit
from contemplation.pipeline import process_pending
from contemplation.runtime import Runtime
from contemplation.settings import Settings
from contemplation.validate import validate
from contemplation.watcher import Watcher, make_watcher
from contemplation.writer import DaemonLock, atomic_write_json, ensure_home

log = structlog.get_logger("contemplation.daemon")

Extra = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


def build_runtime(settings: Settings) -> Runtime:
    """The runtime, with the configuration checked now: a bad value stops the start with one
    line naming the key and its source (the same check ``doctor`` runs)."""
    home = Home(settings.home)
    ensure_home(home)
    return Runtime(settings=settings, home=home, router=validate(settings))


async def run_once(settings: Settings) -> int:
    """``run --once``: process whatever is pending and exit."""
    rt = build_runtime(settings)
    lock = DaemonLock(rt.home)
    lock.acquire()
    try:
        # files written in place settle for settle_seconds, hand appends for twice that
        await process_pending(rt, settle_wait=2 * settings.settle_seconds + 0.05)
    finally:
        await rt.aclose()
        lock.release()
    return 0


async def serve(settings: Settings, *, extras: list[Extra] | None = None) -> int:
    rt = build_runtime(settings)
    lock = DaemonLock(rt.home)
    lock.acquire()
    raise_fd_limit()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(sig: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info("stopping", grace_s=settings.stop_grace)
            if sig == signal.SIGINT and dispatcher.busy:  # a person at a terminal: say so
                _say(_finishing(len(dispatcher.tasks), settings.stop_grace))
            stop.set()
        else:  # a second signal: do not wait for in-flight turns
            log.warning("forced_stop")
            if sig == signal.SIGINT:
                _say("stopping now")
            for t in list(dispatcher.tasks.values()):
                t.cancel()

    dispatcher = Dispatcher(rt)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    # announced once a signal can stop it cleanly: a Ctrl-C right after start is a clean stop
    atomic_write_json(
        rt.home.daemon_info, {"pid": os.getpid(), "started": time.time()}, durable=False
    )

    def resync() -> None:  # events were lost (from the watcher's thread): catch up
        watcher.watch_all()  # folders whose creation event was lost
        loop.call_soon_threadsafe(dispatcher.request_rescan)

    watcher = make_watcher(rt.home.active, dispatcher.poke_threadsafe, resync)
    extra_tasks: list[asyncio.Task[None]] = []
    try:
        watcher.start()
        for conv in list_conversations(rt.home):
            dispatcher.poke(conv.id)
        await dispatcher.say_refused()
        for extra in extras or []:
            extra_tasks.append(asyncio.create_task(extra(rt, stop)))
        sdnotify.notify("READY=1", f"STATUS=watching {rt.home.active}")
        log.info("started", home=str(rt.home.root), pid=os.getpid())
        await _tick(rt, dispatcher, watcher, stop)
    finally:
        sdnotify.notify("STOPPING=1")
        watcher.stop()
        await dispatcher.drain(settings.stop_grace)
        for t in extra_tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*extra_tasks, return_exceptions=True)
        await rt.aclose()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        lock.release()
        log.info("stopped")
    return 0


def _finishing(turns: int, grace: float) -> str:
    what = "the turn" if turns == 1 else f"{turns} turns"
    return f"finishing {what} ({grace:g} s); Ctrl-C again to stop now"


def _say(line: str) -> None:
    """A line for the person at the terminal (stderr, beside the logs)."""
    with contextlib.suppress(OSError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


async def _tick(rt: Runtime, dispatcher: Dispatcher, watcher: Watcher, stop: asyncio.Event) -> None:
    """Rescan every conversation periodically and ping the systemd watchdog from here."""
    interval = rt.settings.rescan_interval
    ping = sdnotify.watchdog_interval()
    step = min(interval, ping) if ping else interval
    next_scan = time.monotonic() + interval
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=step)
        if stop.is_set():
            return
        if ping:
            sdnotify.notify("WATCHDOG=1")
        if time.monotonic() >= next_scan:
            next_scan = time.monotonic() + interval
            watcher.ensure_alive()
            dispatcher.request_rescan()
