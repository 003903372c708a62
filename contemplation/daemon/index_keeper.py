"""The daemon keeps the index current (an extra of :func:`contemplation.daemon.root.serve`).

Every event the daemon already has (a committed block, a status change, an archive, a folder
adopted) marks the index stale; that is all the event loop does, a flag set in an observer. A
worker thread brings the index up to date from the folders once the events pause for
``BATCH_S`` seconds however many came (one batch), and every ``IDLE_S``, so hand edits are
caught too. A burst of turns is indexed once it has passed (or 5 s after it began), so the
refresh does not compete with the turns. With ``[retention] archived_days`` set it prunes once
a day. An index that cannot be written (locked, corrupt, a full disk) costs a log line, never
the daemon.

With the semantic extra installed, each refresh then embeds the conversations whose vectors
are not current (:mod:`contemplation.index.semantic`), newest first, for at most its
``UPDATE_SECONDS`` on the model's one thread, and comes back for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import structlog

from contemplation.index import db, embedder, retention

if TYPE_CHECKING:
    from contemplation.engine.runtime import Runtime

log = structlog.get_logger("contemplation.index")

BATCH_S = 0.5  # a refresh waits for this long without an event ...
MAX_WAIT_S = 5.0  # ... but never longer than this after the first
IDLE_S = 30.0  # a refresh at least this often (hand edits, folders made by hand)
DAY_S = 86400.0


class Keeper:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.stale = asyncio.Event()
        self.refreshes = 0
        self.last_prune = 0.0

    def observe(self, conv_id: str, event: str, data: dict[str, Any]) -> None:
        """Observer: marks the index stale; nothing else on the loop."""
        self.stale.set()

    async def run(self, stop: asyncio.Event) -> None:
        self.stale.set()  # bring it up to date at start (the recovery scan's view)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_S):
                    await _first_of(self.stale, stop)
            if stop.is_set():
                return
            await self.quiet()
            if await asyncio.to_thread(self.refresh):
                self.stale.set()  # vectors left to make: again after the next pause
            await self.maybe_prune()

    async def quiet(self) -> None:
        """Wait until no event came for BATCH_S (a burst of turns is indexed once, after it,
        not on a thread that competes with the turns for the interpreter), at most MAX_WAIT_S
        from the first event."""
        first = time.monotonic()
        while True:
            self.stale.clear()
            await asyncio.sleep(BATCH_S)
            if not self.stale.is_set() or time.monotonic() - first >= MAX_WAIT_S:
                return

    def refresh(self) -> int:
        """The index brought up to date, then vectors made for a slice; how many
        conversations still lack current ones."""
        home = self.rt.home
        try:
            # reading brings it up to date; one that cannot be written is a log line, not a
            # copy in memory that nobody reads
            left = db.read(home, self.embed, fallback=False)
        except Exception as exc:
            log.warning("index_refresh_failed", error=str(exc))
            return 0
        return left

    def embed(self, conn: Any) -> int:
        self.refreshes += 1  # the index is current: counted before its vectors are made
        if not embedder.available():
            return 0
        from contemplation.index import semantic  # numpy: the extra's

        try:
            done = semantic.embed_pending(conn)
        except Exception as exc:  # a model or a write that fails: words still work
            log.warning("embedding_failed", error=str(exc))
            return 0
        if done.embedded:
            log.info("embedded", texts=done.embedded, conversations_left=done.left)
        return done.left

    async def maybe_prune(self) -> None:
        days = self.rt.settings.retention.archived_days
        if days is None or time.time() - self.last_prune < DAY_S:
            return
        self.last_prune = time.time()
        try:
            await asyncio.to_thread(retention.prune, self.rt.home, days * DAY_S)
        except Exception as exc:
            log.warning("prune_failed", error=str(exc))


async def _first_of(a: asyncio.Event, b: asyncio.Event) -> None:
    """Until either event is set: the stop wakes the idle wait."""
    waits = {asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def keep_index(rt: Runtime, stop: asyncio.Event) -> None:
    """Extra for :func:`contemplation.daemon.root.serve`."""
    # [semantic]: the person's embedding server makes the vectors (the offline model if unset)
    embedder.configure(*rt.settings.semantic.server())
    keeper = Keeper(rt)
    with rt.observing(keeper.observe):
        await keeper.run(stop)
