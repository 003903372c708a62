"""Circuit breakers: stop hammering a server (or a model) that keeps failing.

A turn passes two (:class:`Guard`): its server's, which counts only what says the server is
down (refused connections, 5xx), and its model's, which counts the other transient failures
(a model that errors mid-stream, stalls, sends garbage). So one broken model cannot make
every other conversation on the same server wait.

After ``threshold`` transient failures in a row (from any conversation) the breaker opens for
``cooldown`` seconds: turns on that backend wait instead of calling it. Then one turn may
probe (half-open); its success closes the breaker, its failure opens it again for twice as
long (up to ``max_cooldown``). Permanent errors (a missing model, a bad request) say nothing
about the server's health and do not count.

A provider found dead (a connection refused) while another provider of an alias can take its
turns is *watched* instead (:meth:`Breaker.watch`): it rests until a background probe (see
:mod:`contemplation.engine.probing`) finds it back, and no user's turn probes it.

A rest is a duration, measured on ``steady`` (the monotonic clock), so a wall clock stepped
backwards never lengthens it; the times a breaker answers and is given are wall times
(``clock``: what state.json and the faces show).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from contemplation.errors import BackendError

MAX_COOLDOWN = 300.0  # a breaker that keeps failing its probes rests at most this long
LONGEST_TRIP = 3600.0  # the longest rest a trip (a server's Retry-After) may ask


@dataclass
class Breaker:
    threshold: int = 5
    cooldown: float = 10.0
    max_cooldown: float = MAX_COOLDOWN
    clock: Callable[[], float] = field(default=lambda: 0.0)  # wall: the times it answers
    steady: Callable[[], float] | None = None  # what rests are measured on (None: clock)
    failures: int = 0
    opened_at: float | None = None  # on the steady clock
    current_cooldown: float = 0.0
    probing: bool = False
    watched: bool = False  # rests until a background probe says it is back (no turn probes)

    def _now(self) -> float:
        return (self.steady or self.clock)()

    @property
    def open_until(self) -> float | None:
        """When the rest ends, on the steady clock."""
        if self.opened_at is None:
            return None
        return self.opened_at + self.current_cooldown

    def resting(self) -> float | None:
        """When the backend may be tried again (a wall time), if it may not be now (nothing
        changes)."""
        until = self.open_until
        now = self._now()
        if until is None or (now >= until and not self.probing and not self.watched):
            return None
        left = max(until - now, 0.5) if self.probing or self.watched else until - now
        return self.clock() + left

    def allow(self) -> bool:
        """May a turn call the backend now? (At most one probe while half-open.)"""
        until = self.open_until
        if until is None:
            return True
        if self._now() < until or self.probing or self.watched:
            return False
        self.probing = True
        return True

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.current_cooldown = 0.0
        self.probing = False
        self.watched = False

    def failure(self) -> None:
        self.failures += 1
        if self.probing:
            self.probing = False
            self.current_cooldown = min(self.max_cooldown, self.current_cooldown * 2)
            self.opened_at = self._now()
        elif self.failures >= self.threshold and self.opened_at is None:
            self.current_cooldown = self.cooldown
            self.opened_at = self._now()

    def release(self) -> None:
        """A probe that ended without a verdict (cancelled): let another one try."""
        self.probing = False

    def trip(self, until: float) -> None:
        """Open now until ``until`` (a wall time: a server's Retry-After, a provider that
        failed over; at most ``LONGEST_TRIP`` off), whatever the count; then one turn probes
        as after any rest."""
        rest = min(LONGEST_TRIP, max(0.0, until - self.clock()))
        self.opened_at, self.current_cooldown = self._now(), rest
        self.probing = False

    def watch(self, until: float) -> None:
        """Rest until a background probe calls :meth:`success`; ``until`` (a wall time: the
        next probe's) is what :meth:`resting` answers meanwhile. No turn may probe."""
        self.trip(until)
        self.watched = True

    def unwatch(self) -> None:
        """The probe stopped (the daemon stops): the rest ends as any other, and a turn
        probes after it."""
        self.watched = False


@dataclass
class Guard:
    """The server's and the model's breaker, passed together by one turn."""

    server: Breaker
    model: Breaker

    def resting(self) -> float | None:
        times = [t for t in (self.server.resting(), self.model.resting()) if t is not None]
        return max(times) if times else None

    def allow(self) -> bool:
        if not self.server.allow():
            return False
        if not self.model.allow():
            self.server.release()
            return False
        return True

    def release(self) -> None:
        self.server.release()
        self.model.release()

    def success(self) -> None:
        self.server.success()
        self.model.success()

    def failure(self, exc: BackendError) -> None:
        (self.server if exc.server_down else self.model).failure()

    @property
    def failures(self) -> int:
        return max(self.server.failures, self.model.failures)
