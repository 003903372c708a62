"""Deprecated: the dashboard's cards were called panels (a panel is now several models
answering one round). The registry is :mod:`contemplation.faces.dashboard.cards`; these
names stay for code written against the old ones."""

from __future__ import annotations

from contemplation.faces.card import Panel, Row, Seen
from contemplation.faces.dashboard.cards import (
    KINDS,
    MAX_ROWS,
    MAX_TEXT,
    failures,
    kinds,
    origins,
    register,
)

__all__ = [
    "KINDS", "MAX_ROWS", "MAX_TEXT", "Panel", "Row", "Seen", "failures", "kinds", "origins",
    "register",
]  # fmt: skip
