"""Pure: how close a conversation is to a query by meaning, read against the query's own
scores rather than one fixed floor.

An embedding model's cosines sit in a narrow band that moves with the query (e5's between
0.75 and 0.85 for short texts: a short query's right answer at 0.79, a long vague one's noise
at 0.81), so a fixed floor both dropped the right answer and let noise in. Here every
conversation's best score is compared with the scores of all the conversations searched: its
distance from their median in standard deviations (``z``). The model's ranking is kept as it
is; what adapts is the cut and the words a person reads:

- ``close``: ``z`` >= :data:`CLOSE_Z` (it stands out of the crowd);
- ``near``: ``z`` >= :data:`NEAR_Z`;
- ``far``: the rest.

A ranking keeps the conversations within :data:`GAP_Z` of the best and at least
:data:`FLOOR_Z`; when even the best is far (``weak``), nothing is cut: the nearest are
listed, in order, and the faces say "nothing close" before them. With fewer than
:data:`MIN_CALIBRATE` conversations there is no crowd to read a score against: all of them
are ranked, none labelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CLOSE_Z = 3.0
NEAR_Z = 2.0
GAP_Z = 1.5  # kept: within this of the best (1.0 lost one hard query of 36 in the top 3)
FLOOR_Z = 1.0  # ... and at least this far above the median
MIN_CALIBRATE = 8


@dataclass(frozen=True, slots=True)
class Calibration:
    """The query's scores over every conversation searched: their median and spread."""

    center: float
    spread: float
    count: int

    def z(self, score: float) -> float:
        return (score - self.center) / self.spread if self.spread > 0 else 0.0

    def label(self, score: float) -> str:
        if self.count < MIN_CALIBRATE:
            return ""
        z = self.z(score)
        return "close" if z >= CLOSE_Z else "near" if z >= NEAR_Z else "far"


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a ranking stops, and whether its best is far from the query (``weak``)."""

    keep: int  # how many of the ranking, best first
    weak: bool


def cut(ranked: Sequence[float], cal: Calibration) -> Cut:
    """How much of ``ranked`` (scores, best first) is about the query: those within
    :data:`GAP_Z` of the best and at least :data:`FLOOR_Z`; all of it when the best is far
    (weak) or there are too few conversations to tell."""
    if not ranked or cal.count < MIN_CALIBRATE or cal.spread <= 0:
        return Cut(len(ranked), False)
    best = cal.z(ranked[0])
    if best < NEAR_Z:
        return Cut(len(ranked), True)
    bar = max(best - GAP_Z, FLOOR_Z)
    keep = next((i for i, s in enumerate(ranked) if cal.z(s) < bar), len(ranked))
    return Cut(max(keep, 1), False)
