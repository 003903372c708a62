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
from typing import TYPE_CHECKING, Any

import structlog

from contemplation.backends import available as backend_families
from contemplation.base import ending, privacy, sdnotify
from contemplation.config.reload import compare, fingerprint, load_new
from contemplation.config.validate import validate
from contemplation.daemon.dispatcher import Dispatcher
from contemplation.daemon.limits import raise_fd_limit
from contemplation.daemon.loopwatch import LoopWatch
from contemplation.daemon.watcher import Watcher, make_watcher
from contemplation.engine.pipeline import left_undone, process_pending
from contemplation.engine.runtime import Runtime
from contemplation.engine.tracking import Tracked
from contemplation.errors import ContemplationError
from contemplation.settings import Settings
from contemplation.store.layout import Home, list_conversations
from contemplation.writer import DaemonLock, atomic_write_json, ensure_home

if TYPE_CHECKING:
    from contemplation.needs.router import NeedRouter

log = structlog.get_logger("contemplation.daemon")

Extra = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


def build_runtime(settings: Settings) -> Runtime:
    """The runtime, with the configuration checked now: a bad value stops the start with one
    line naming the key and its source (the same check ``doctor`` runs)."""
    from contemplation.backends import http

    home = Home(settings.home)
    router = validate(settings)  # first: a start refused for its settings changes nothing
    try:  # made open by an older version: closed, nothing below it is theirs any more
        was = privacy.close(home.root)
    except OSError as exc:  # not ours to change: said, and the start goes on
        log.warning("home_open_to_others", home=str(home.root), error=str(exc))
    else:
        if was is not None:
            log.warning("home_made_private", home=str(home.root), was=f"{was:o}", now="700")
    ensure_home(home)
    http.preload()
    return Runtime(settings=settings, home=home, router=router)


SAID_FAILED = 10  # conversations named in run --once's last line; the rest are counted


async def run_once(settings: Settings) -> int:
    """``run --once``: process whatever is pending and exit: 0, or 1 when a conversation
    could not be done (a step that failed, a turn left to retry: its message is kept for the
    next run; a line names each, beside the log's lines), so a script or a timer sees it."""
    rt = build_runtime(settings)
    lock = DaemonLock(rt.home)
    lock.acquire()
    seen = Tracked()
    try:
        # files written in place settle for settle_seconds, hand appends for twice that
        wakes = await process_pending(rt, settle_wait=2 * settings.settle_seconds + 0.05, seen=seen)
        undone = sorted(left_undone(rt, wakes, seen).items())
    finally:
        await rt.aclose()
        lock.release()
    if not undone:
        return 0
    n = len(undone)
    named = "; ".join(f"{conv}: {what}" for conv, what in undone[:SAID_FAILED])
    more = f"; and {n - SAID_FAILED} more" if n > SAID_FAILED else ""
    _say(f"run --once: {n} conversation{'s' if n != 1 else ''} not done ({named}{more})")
    return 1


async def serve(
    settings: Settings,
    *,
    extras: list[Extra] | None = None,
    loader: Callable[[], Settings] | None = None,
) -> int:
    """Run until a signal. ``loader`` reads the settings anew from the sources they came
    from: SIGHUP reloads them with it (see :mod:`contemplation.config.reload`). While it
    serves, a plugin's ``os._exit`` ends the process as a failure; once it has stopped, the
    exit is bounded whatever a plugin's threads do (:mod:`contemplation.base.ending`)."""
    with ending.exits_are_failures():
        code = await _serve(settings, extras=extras, loader=loader)
    ending.arm(code)  # from here on the exit is bounded (asyncio.run's end, the threads')
    return code


async def _serve(
    settings: Settings,
    *,
    extras: list[Extra] | None,
    loader: Callable[[], Settings] | None,
) -> int:
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
    _on_hup_reload(loop, rt, dispatcher, loader)()

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
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        lock.release()
        log.info("stopped")
    return 0


def _on_hup_reload(
    loop: asyncio.AbstractEventLoop,
    rt: Runtime,
    dispatcher: Dispatcher,
    loader: Callable[[], Settings] | None,
) -> Callable[[], None]:
    """SIGHUP reloads the settings (one reload task at a time is plenty: they are quick);
    returns what writes the daemon's info file (pid, start, the settings' fingerprint)."""
    started = time.time()
    reloads: set[asyncio.Task[None]] = set()

    def announce() -> None:
        info = {"pid": os.getpid(), "started": started, "settings": fingerprint(rt.settings)}
        atomic_write_json(rt.home.daemon_info, info, durable=False)

    def on_hup() -> None:
        if loader is None:
            log.warning("reload_unsupported", why="this daemon was started without a loader")
            return
        task = asyncio.create_task(_reload(rt, dispatcher, loader, announce))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    return announce


async def _reload(
    rt: Runtime,
    dispatcher: Dispatcher,
    loader: Callable[[], Settings],
    announce: Callable[[], None],
) -> None:
    """SIGHUP: the settings read anew and checked as at a start; a bad file is refused with one
    line and the old settings stay. Never raises: a reload cannot stop the daemon."""
    try:
        routers: list[NeedRouter] = []

        def check(new: Settings) -> None:
            routers.append(validate(new))

        new = await asyncio.to_thread(load_new, loader, check)
    except ContemplationError as exc:
        log.error("reload_refused", error=str(exc), kept="the settings it runs with")  # noqa: TRY400 - the message is the whole story
        return
    except Exception as exc:
        log.exception("reload_failed", error=str(exc))
        return
    change = compare(rt.settings, new, backend_families())
    if change.restart:
        log.warning("reload_needs_restart", keys=list(change.restart))
        new = new.model_copy(update={k: getattr(rt.settings, k) for k in change.restart})
    rt.apply(new, routers[0], change.backends)
    woken = dispatcher.retry_now(change.backends)
    announce()
    log.info("reloaded", backends=sorted(change.backends), retrying_now=woken)


def _finishing(turns: int, grace: float) -> str:
    what = "the turn" if turns == 1 else f"{turns} turns"
    return f"finishing {what} ({grace:g} s); Ctrl-C again to stop now"


def _say(line: str) -> None:
    """A line for the person at the terminal (stderr, beside the logs)."""
    with contextlib.suppress(OSError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


async def _tick(rt: Runtime, dispatcher: Dispatcher, watcher: Watcher, stop: asyncio.Event) -> None:
    """Rescan every conversation periodically and ping the systemd watchdog from here (a
    loop blocked past WatchdogSec misses it); a thread names what blocks the loop."""
    with LoopWatch(asyncio.get_running_loop()).running():
        await _ticks(rt, dispatcher, watcher, stop)


async def _ticks(
    rt: Runtime, dispatcher: Dispatcher, watcher: Watcher, stop: asyncio.Event
) -> None:
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
