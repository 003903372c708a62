"""A provider found dead, probed in the background until it answers again.

A provider that refused a turn's connection while its alias has another provider rests (its
server breaker is *watched*, see :meth:`~contemplation.engine.breaker.Breaker.watch`), and the
turns go elsewhere at once. No user's turn is sent to find out whether it is back: one task
(its :class:`Probe`, which the provider keeps with its breakers) asks its model list (Ollama's
``/api/tags``, ``/v1/models``: a connect and a small answer) after 1 s, then after twice as
long each time, at most ``breaker_cooldown`` apart. The first answer closes the breaker and
ends the task. At most one task per provider; all end with the daemon (:meth:`Probe.aclose`),
and their breakers rest as any other then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from contemplation.engine.breaker import Breaker
from contemplation.errors import ConfigError

log = structlog.get_logger("contemplation.probing")

FIRST_PROBE = 1.0  # seconds after the failure; then twice as long each time
PROBE_TIMEOUT = 5.0  # a probe that has no answer by then failed
MARGIN = 0.5  # a turn waiting for a rest wakes this long after the probe meant to end it

Ask = Callable[[], Awaitable[object]]


@dataclass
class Probe:
    """Provider ``name``'s background probe of its server ``breaker``: ``clock`` is the wall
    clock the breaker answers in."""

    name: str
    breaker: Breaker
    clock: Callable[[], float]
    first: float = FIRST_PROBE
    timeout: float = PROBE_TIMEOUT
    task: asyncio.Task[None] | None = None

    def watch(self, ask: Callable[[], Ask], longest: float) -> None:
        """Rest the provider until ``ask()()`` answers; asked again at most ``longest``
        seconds apart. ``ask`` is looked up at each probe (a reload may have replaced the
        provider's client). Watching one already watched does nothing more than keep it
        resting."""
        delay = min(self.first, longest)
        self.breaker.watch(self.clock() + delay + MARGIN)
        if self.task is not None and not self.task.done():
            return
        self.task = asyncio.get_running_loop().create_task(
            self._probe(ask, delay, longest), name=f"probe {self.name}"
        )

    async def _probe(self, ask: Callable[[], Ask], delay: float, longest: float) -> None:
        breaker = self.breaker
        try:
            while breaker.watched:
                await asyncio.sleep(delay)
                try:
                    await asyncio.wait_for(ask()(), self.timeout)
                except ConfigError as exc:  # the provider is gone from the settings
                    log.info("probe_stopped", provider=self.name, error=str(exc))
                    breaker.success()
                    return
                except Exception as exc:  # whatever the failure: not back yet
                    delay = min(delay * 2, longest)
                    breaker.watch(self.clock() + delay + MARGIN)
                    log.debug("probe_failed", provider=self.name, error=str(exc), next_in=delay)
                    continue
                log.info("provider_back", provider=self.name)
                breaker.success()
        finally:
            if self.task is asyncio.current_task():
                self.task = None

    async def aclose(self) -> None:
        """Stop the probe; the provider it watched rests as any other breaker does."""
        task, self.task = self.task, None
        if task is None:
            return
        self.breaker.unwatch()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
