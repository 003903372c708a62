"""Retry times: kept in ``state.json`` as wall times (a restart reads them back, the faces
show them), waited for on the monotonic clock, so a wall clock stepped backwards (NTP after a
bad RTC, a person fixing the date) never makes a retrying conversation wait for the step.

The daemon notes each retry time a step leaves, right after it was set (:meth:`RetryClock.note`),
with the monotonic time it stands for; a later look at the conversation reads it back as a
wall time in the terms of the clock *now* (:meth:`RetryClock.due`). A retry time this process
did not note (set before a restart) is trusted up to the longest wait the daemon ever sets,
and clamped beyond it: a clock stepped back a day between two runs costs at most that wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contemplation.engine.breaker import LONGEST_TRIP, MAX_COOLDOWN
from contemplation.settings import Settings


def longest_wait(settings: Settings) -> float:
    """The furthest off a retry the daemon sets can be: a backoff (``retry.cap``), a breaker's
    rest (its cooldown, doubled up to ``MAX_COOLDOWN``) or a server's Retry-After."""
    return max(settings.retry.cap, settings.breaker_cooldown, MAX_COOLDOWN, LONGEST_TRIP)


@dataclass
class RetryClock:
    wall: Callable[[], float] = time.time
    steady: Callable[[], float] = time.monotonic
    _noted: dict[str, tuple[float, float]] = field(default_factory=dict)  # id → (wall, steady)

    def note(self, conv_id: str, at: float | None) -> None:
        """The retry time a step left in state.json (None: none), noted when it is new."""
        if at is None:
            self._noted.pop(conv_id, None)
            return
        got = self._noted.get(conv_id)
        if got is None or got[0] != at:
            self._noted[conv_id] = (at, self.steady() + (at - self.wall()))

    def due(self, conv_id: str, at: float | None, now: float, longest: float) -> float | None:
        """The retry time ``at`` read from state.json as a wall time in the terms of ``now``
        (the wall clock at this look): what is left of it on the monotonic clock when this
        process noted it, else ``at`` clamped to ``longest`` seconds from now (and noted)."""
        if at is None:
            return None
        got = self._noted.get(conv_id)
        if got is not None and got[0] == at:
            return now + (got[1] - self.steady())
        clamped = min(at, now + longest)
        self._noted[conv_id] = (at, self.steady() + (clamped - now))
        return clamped

    def forget(self, conv_id: str) -> None:
        """The conversation is gone (archived, deleted): nothing is kept for it."""
        self._noted.pop(conv_id, None)
