"""Providers found dead, probed in the background until they answer again.

A provider that refused a turn's connection while its alias has another provider rests (its
server breaker is *watched*, see :meth:`~contemplation.engine.breaker.Breaker.watch`), and the
turns go elsewhere at once. No user's turn is sent to find out whether it is back: one task
per provider asks its model list (Ollama's ``/api/tags``, ``/v1/models``: a connect and a
small answer) after 1 s, then after twice as long each time, at most ``breaker_cooldown``
apart. The first answer closes the breaker and ends the task. At most one task per provider;
all end with the daemon (:meth:`Prober.aclose`), and their breakers rest as any other then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from contemplation.engine.breaker import Breaker
from contemplation.errors import ConfigError

log = structlog.get_logger("contemplation.probing")

FIRST_PROBE = 1.0  # seconds after the failure; then twice as long each time
PROBE_TIMEOUT = 5.0  # a probe that has no answer by then failed
MARGIN = 0.5  # a turn waiting for a rest wakes this long after the probe meant to end it

Ask = Callable[[], Awaitable[object]]


@dataclass
class Prober:
    """The background probes: ``clock`` is the wall clock the breakers answer in."""

    clock: Callable[[], float]
    first: float = FIRST_PROBE
    timeout: float = PROBE_TIMEOUT
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    watched: dict[str, Breaker] = field(default_factory=dict)

    def watch(self, name: str, breaker: Breaker, ask: Callable[[], Ask], longest: float) -> None:
        """Rest provider ``name`` (its server ``breaker``) until ``ask()()`` answers; asked
        again at most ``longest`` seconds apart. ``ask`` is looked up at each probe (a reload
        may have replaced the provider's client). Watching one already watched does nothing
        more than keep it resting."""
        delay = min(self.first, longest)
        breaker.watch(self.clock() + delay + MARGIN)
        self.watched[name] = breaker
        task = self.tasks.get(name)
        if task is not None and not task.done():
            return
        self.tasks[name] = asyncio.get_running_loop().create_task(
            self._probe(name, breaker, ask, delay, longest), name=f"probe {name}"
        )

    async def _probe(
        self, name: str, breaker: Breaker, ask: Callable[[], Ask], delay: float, longest: float
    ) -> None:
        try:
            while breaker.watched:
                await asyncio.sleep(delay)
                try:
                    await asyncio.wait_for(ask()(), self.timeout)
                except ConfigError as exc:  # the provider is gone from the settings
                    log.info("probe_stopped", provider=name, error=str(exc))
                    breaker.success()
                    return
                except Exception as exc:  # whatever the failure: not back yet
                    delay = min(delay * 2, longest)
                    breaker.watch(self.clock() + delay + MARGIN)
                    log.debug("probe_failed", provider=name, error=str(exc), next_in=delay)
                    continue
                log.info("provider_back", provider=name)
                breaker.success()
        finally:
            self.watched.pop(name, None)
            if self.tasks.get(name) is asyncio.current_task():
                del self.tasks[name]

    async def aclose(self) -> None:
        """Stop every probe; the providers they watched rest as any other breaker does."""
        for breaker in list(self.watched.values()):
            breaker.unwatch()
        tasks, self.tasks = list(self.tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.watched.clear()
