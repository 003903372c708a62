"""Runs :func:`~contemplation.engine.pipeline.process` for poked conversations, one task each.

* one task per conversation at a time; a poke during a run marks it to run again after;
* the wake-up time a run returns (retry, settling file) becomes a timer;
* a poke that finds ``.cancel`` next to a running turn cancels that task for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Mapping, Set
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

from contemplation.engine.pipeline import process_safely
from contemplation.engine.runtime import Runtime
from contemplation.engine.tracking import Tracked
from contemplation.store.layout import (
    CANCEL_NAME,
    INBOX,
    LOG_NAME,
    PROCESSING,
    Conv,
    ignored_name,
    read_metadata,
    refused_folders,
    valid_id,
)

log = structlog.get_logger("contemplation.dispatcher")


REFUSED_KEPT = 10_000  # folders not taken that the log has named (each once)


class Dispatcher:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.dirty: set[str] = set()
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.stopping = False
        self.seen = Tracked()  # what is remembered about each conversation
        self._loop = asyncio.get_running_loop()
        self._scan: asyncio.Task[None] | None = None
        self._scan_again = False
        self._scanner: ThreadPoolExecutor | None = None  # one thread, made at the first scan
        self.refused_said: set[str] = set()  # folders not taken, already named in the log

    def poke_threadsafe(
        self, conv_id: str, ready: Path | None = None, log_only: bool = False
    ) -> None:
        """Called from the watcher thread."""
        with contextlib.suppress(RuntimeError):  # loop closed during shutdown
            self._loop.call_soon_threadsafe(self.poke, conv_id, ready, log_only)

    def _log_moved(self, conv_id: str) -> bool | None:
        """Has messages.log changed since the daemon last left it? None: never seen it."""
        known = self.seen.log_sizes.get(conv_id)
        if known is None:
            return None
        try:
            return (self.rt.home.active / conv_id / LOG_NAME).stat().st_size != known
        except OSError:
            return True

    def poke(self, conv_id: str, ready: Path | None = None, log_only: bool = False) -> None:
        if self.stopping:
            return
        if log_only and (conv_id in self.tasks or self._log_moved(conv_id) is False):
            # the echo of the daemon's own appends; a hand append during a run is found when
            # the run ends (the log is not as the daemon left it)
            return
        if ready is not None:
            self.seen.fast_ready.add(ready)
        task = self.tasks.get(conv_id)
        if task is not None:
            self.dirty.add(conv_id)
            conv = self.rt.home.conv(conv_id)
            if conv.cancel_flag.exists() and conv_id not in self.seen.cancelled:
                self.seen.cancelled.add(conv_id)
                task.cancel()
            return
        timer = self.timers.pop(conv_id, None)
        if timer is not None:
            timer.cancel()
        self.tasks[conv_id] = asyncio.create_task(self._run(conv_id), name=f"conv:{conv_id}")

    async def _run(self, conv_id: str) -> None:
        wake: float | None = None
        try:
            while True:
                self.dirty.discard(conv_id)
                conv = Conv(self.rt.home.active / conv_id)
                try:
                    wake = await process_safely(conv, self.rt, self.seen)
                except asyncio.CancelledError:
                    if conv_id in self.seen.cancelled and not self.stopping:
                        self.seen.cancelled.discard(conv_id)
                        self.dirty.add(conv_id)  # the next step writes the CANCELLED marker
                        wake = None
                    else:
                        raise
                if self.stopping:
                    break
                if conv_id not in self.dirty and (wake is not None or not self._log_moved(conv_id)):
                    break  # (a wake time means a timer looks again: never spin here)
        finally:
            self.tasks.pop(conv_id, None)
        if wake is not None and not self.stopping:
            delay = max(0.0, wake - self.rt.clock())  # wake is in the runtime's wall time
            self.timers[conv_id] = self._loop.call_later(delay, self._wake, conv_id)

    def request_rescan(self) -> None:
        """Start a rescan (the periodic tick, lost events) unless one runs; one asked for
        meanwhile runs once it ends. Never blocks: the scan runs on its own thread."""
        if self.stopping:
            return
        if self._scan is not None and not self._scan.done():
            self._scan_again = True
            return
        self._scan = asyncio.create_task(self._rescans(), name="rescan")

    async def _rescans(self) -> None:
        while True:
            self._scan_again = False
            await self.rescan()
            if not self._scan_again or self.stopping:
                return

    async def rescan(self) -> int:
        """The periodic safety net: poke every conversation that shows a sign of new work.

        The look runs on the dispatcher's own thread: a few system calls per conversation
        (the log's size against what the daemon last left, inbox and processing entries, a
        cancel flag) come to ~20 µs each, i.e. ~45 ms for 2,000 conversations, which would
        hold every turn and every poke if it ran on the loop. Returns how many were poked.
        A failing scan (EMFILE, a vanished home) is logged and tried again next time.
        """
        if self._scanner is None:
            self._scanner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rescan")
        skip = frozenset(self.tasks) | frozenset(self.timers)  # running or asleep: left alone
        known = dict(self.seen.log_sizes)  # a copy: the loop goes on changing the original
        look = functools.partial(signs_of_work, str(self.rt.home.active), known, skip)
        try:
            names = await self._loop.run_in_executor(self._scanner, look)
        except OSError as exc:
            log.warning("rescan_failed", error=str(exc))
            return 0
        await self.say_refused()
        poked = 0
        for name in names:
            if self.stopping or name in self.tasks or name in self.timers:
                continue  # started or put to sleep while the scan ran
            self.poke(name)
            poked += 1
        return poked

    async def say_refused(self) -> None:
        """Each folder the daemon will not take, named once in the log with why (at start,
        then at each rescan for folders made since)."""
        if self._scanner is None:
            self._scanner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rescan")
        home = self.rt.home
        try:
            refused = await self._loop.run_in_executor(self._scanner, refused_folders, home)
        except OSError:
            return
        for where, why in refused:
            if where not in self.refused_said and len(self.refused_said) < REFUSED_KEPT:
                self.refused_said.add(where)
                log.warning("folder_not_taken", folder=where, why=why)

    def retry_now(self, families: frozenset[str]) -> int:
        """After a reload: the conversations asleep until a retry on a backend whose settings
        changed are woken and retry at once. How many."""
        woken = 0
        for conv_id in list(self.timers):
            meta = read_metadata(Conv(self.rt.home.active / conv_id))
            if meta is not None and meta.backend in families:
                self.rt.retry_now.add(conv_id)
                timer = self.timers.get(conv_id)
                if timer is not None:
                    timer.cancel()
                self._wake(conv_id)
                woken += 1
        return woken

    def _wake(self, conv_id: str) -> None:
        self.timers.pop(conv_id, None)
        self.poke(conv_id)

    async def _stop_scanning(self) -> None:
        """A running scan is let go of (its thread ends by itself: one pass over the home)."""
        if self._scan is not None and not self._scan.done():
            self._scan.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan
        if self._scanner is not None:
            self._scanner.shutdown(wait=False, cancel_futures=True)
            self._scanner = None

    @property
    def busy(self) -> bool:
        return bool(self.tasks)

    async def drain(self, grace: float) -> None:
        """Stop taking work; let running turns finish within ``grace``, then cancel them."""
        self.stopping = True
        self.seen.stopping = True
        await self._stop_scanning()
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        tasks = list(self.tasks.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            log.info("cancelling_in_flight_turns", count=len(pending))
            await asyncio.wait(pending, timeout=10)


def signs_of_work(active: str, known: Mapping[str, int], skip: Set[str]) -> list[str]:
    """The conversations under ``active`` (but those in ``skip``) that show a sign of new
    work: a log whose size is not the one ``known`` (or none known), an inbox or processing
    entry, a cancel flag. Plain strings and system calls: it runs off the loop."""
    with os.scandir(active) as it:
        names = [e.name for e in it if valid_id(e.name) and e.is_dir(follow_symlinks=False)]
    return [n for n in names if n not in skip and _worth_a_look(f"{active}/{n}", known.get(n))]


def _dotted(name: str) -> bool:
    return name.startswith(".")


def _worth_a_look(d: str, known: int | None) -> bool:
    try:
        if known is None or os.stat(f"{d}/{LOG_NAME}").st_size != known:
            return True
    except OSError:
        return True
    # the inbox's names by the layout's own filter (a file being written is no message); the
    # claimed ones as processing_entries lists them
    for folder, skip in ((INBOX, ignored_name), (PROCESSING, _dotted)):
        try:
            with os.scandir(f"{d}/{folder}") as it:
                if any(not skip(e.name) for e in it):
                    return True
        except OSError:
            continue
    return os.path.lexists(f"{d}/{CANCEL_NAME}")
