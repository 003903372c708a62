"""The contract of a dashboard panel, and nothing else (a leaf: a plugin that writes a panel
imports it through :mod:`contemplation.plugin` without loading the dashboard or its web
framework). The registry and the page are :mod:`contemplation.faces.dashboard.panels`'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contemplation.store.layout import Home


@dataclass(frozen=True, slots=True)
class Seen:
    """What a panel's rows are computed from."""

    home: Home
    live: dict[str, Any]  # this run's counters (dashboard.live.Metrics.snapshot)


Row = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Panel:
    name: str  # the element's id: a lower-case word
    title: str
    rows: Callable[[Seen], list[Row]]  # on a worker thread; bounded by the page
