"""Backends by name. Each family is a sibling module; :func:`build` picks one by its key."""

from __future__ import annotations

from collections.abc import Callable

from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
from contemplation.errors import ConfigError
from contemplation.settings import Settings, TimeoutSettings, ollama_base

__all__ = ["Backend", "Capabilities", "Check", "PhaseTimeouts", "available", "build"]


def phase_timeouts(t: TimeoutSettings) -> PhaseTimeouts:
    return PhaseTimeouts(connect=t.connect, first_byte=t.first_byte, idle=t.idle, total=t.total)


def _ollama(settings: Settings) -> Backend:
    from contemplation.backends.ollama import OllamaBackend

    url, auth = ollama_base(settings)
    s = settings.ollama
    return OllamaBackend(
        url,
        auth=auth,
        num_ctx=s.num_ctx,
        keep_alive=s.keep_alive,
        timeouts=phase_timeouts(s.timeouts),
        concurrency=s.concurrency,
    )


_FACTORIES: dict[str, Callable[[Settings], Backend]] = {
    "ollama": _ollama,
}


def available() -> list[str]:
    return sorted(_FACTORIES)


def register(name: str, factory: Callable[[Settings], Backend]) -> None:
    """Add a backend family (used by sibling modules and by tests for in-process fakes)."""
    _FACTORIES[name] = factory


def build(name: str, settings: Settings) -> Backend:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(available())}") from None
    return factory(settings)
