"""The contract of a dashboard card, and nothing else (a leaf: a plugin that writes a card
imports it through :mod:`contemplation.plugin` without loading the dashboard or its web
framework). The registry and the page are :mod:`contemplation.faces.dashboard.cards`'.

A *card* is a titled box of rows on the dashboard's page. It was called a panel until a
panel came to mean several models answering one round (:mod:`contemplation.protocol.panel`);
``contemplation.plugin.Panel`` and the entry point group ``contemplation.panels`` still work
(deprecated: ``Card`` and ``contemplation.cards``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contemplation.store.layout import Home


@dataclass(frozen=True, slots=True)
class Seen:
    """What a card's rows are computed from."""

    home: Home
    live: dict[str, Any]  # this run's counters (dashboard.live.Metrics.snapshot)


Row = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Card:
    name: str  # the element's id: a lower-case word
    title: str
    rows: Callable[[Seen], list[Row]]  # on a worker thread; bounded by the page


@dataclass(frozen=True, slots=True)
class Panel(Card):
    """Deprecated: a :class:`Card` under its former name (a plugin written against it still
    registers one)."""
