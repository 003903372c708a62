"""Entry points read once per process: what each plugin registers, and what failed.

Every registry (NEED tools, backends, context kinds) loads its group through :func:`load`:
an entry point names one kind, several, or a callable that returns one or several; a plugin
that fails to import, returns something else or raises costs one log line and a ``failed``
row (shown by ``plugins`` and ``doctor``), never the process. Reading the entry points costs
about 25 ms, so a registry reads them only when it is asked for something it does not hold
already.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import structlog

log = structlog.get_logger("contemplation.plugins")

K = TypeVar("K")
Failure = tuple[str, str]  # (entry point and distribution, why it was not loaded)


def load(group: str, kind: type[K], register: Callable[[K, str], None]) -> list[Failure]:
    """Register every kind the entry points of ``group`` give (``register(kind, dist)``)."""
    from importlib.metadata import entry_points

    failed: list[Failure] = []
    for ep in entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        try:
            found = ep.load()
            if callable(found) and not isinstance(found, kind):
                found = found()
            for one in [found] if isinstance(found, kind) else _each(found, kind):
                register(one, dist)
        except Exception as exc:  # a plugin's bug must not stop the daemon
            where = f"{ep.name} ({dist})"
            failed.append((where, f"{type(exc).__name__}: {exc}"))
            log.warning("plugin_failed", plugin=where, group=group, error=str(exc))
    return failed


def _each(found: object, kind: type[K]) -> list[K]:
    name = kind.__name__
    if not isinstance(found, Iterable):
        raise TypeError(f"gave {type(found).__name__}, not a {name} or several")
    out = list(found)
    for one in out:
        if not isinstance(one, kind):
            raise TypeError(f"gave {type(one).__name__} among its kinds, not a {name}")
    return out
