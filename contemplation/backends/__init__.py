"""Backends by name. Each family is a sibling module; :func:`build` picks one by its key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from contemplation.errors import ConfigError

if TYPE_CHECKING:  # the families pull in aiohttp: a command that only names them does not
    from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
    from contemplation.settings import Settings, TimeoutSettings

__all__ = [
    "Backend", "Capabilities", "Check", "PhaseTimeouts", "available", "build", "check_all",
]  # fmt: skip

_BASE_NAMES = frozenset({"Backend", "Capabilities", "Check", "PhaseTimeouts"})


def __getattr__(name: str) -> Any:
    """The base types, imported when first asked for (``backends.Backend``)."""
    if name in _BASE_NAMES:
        from contemplation.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def phase_timeouts(t: TimeoutSettings, max_line: int = 4 * 1024 * 1024) -> PhaseTimeouts:
    from contemplation.backends.base import PhaseTimeouts

    return PhaseTimeouts(
        connect=t.connect, first_byte=t.first_byte, idle=t.idle, total=t.total, max_line=max_line
    )


def _ollama(settings: Settings) -> Backend:
    from contemplation.backends.ollama import OllamaBackend
    from contemplation.settings import ollama_base

    url, auth = ollama_base(settings)
    s = settings.ollama
    return OllamaBackend(
        url,
        auth=auth,
        num_ctx=s.num_ctx,
        keep_alive=s.keep_alive,
        timeouts=phase_timeouts(s.timeouts, settings.max_reply_bytes),
        concurrency=s.concurrency,
        overrides=settings.capabilities,
    )


def _openai(settings: Settings) -> Backend:
    from contemplation.backends.openai import OpenAIBackend

    s = settings.openai
    return OpenAIBackend(
        s.base_url,
        api_key=s.api_key,
        timeouts=phase_timeouts(s.timeouts, settings.max_reply_bytes),
        concurrency=s.concurrency,
        stream_usage=s.stream_usage,
        overrides=settings.capabilities,
    )


def _opencode(settings: Settings) -> Backend:
    from contemplation.backends.opencode import OpenCodeBackend

    s = settings.opencode
    return OpenCodeBackend(
        s.url,
        auth=(s.username or "opencode", s.password) if s.password else None,
        tools=s.tools,
        agent=s.agent,
        timeouts=s.timeouts,
        concurrency=s.concurrency,
        overrides=settings.capabilities,
    )


def _local(settings: Settings) -> Backend:
    from contemplation.backends.local import LocalBackend

    s = settings.local
    return LocalBackend(
        model_path=s.model_path,
        n_ctx=s.n_ctx,
        n_parallel=s.n_parallel,
        n_threads=s.n_threads,
        timeouts=phase_timeouts(s.timeouts),
        overrides=settings.capabilities,
    )


_FACTORIES: dict[str, Callable[[Settings], Backend]] = {
    "ollama": _ollama,
    "openai": _openai,
    "opencode": _opencode,
    "local": _local,
}


def available() -> list[str]:
    return sorted(_FACTORIES)


def register(name: str, factory: Callable[[Settings], Backend]) -> None:
    """Add a backend family (used by sibling modules and by tests for in-process fakes)."""
    _FACTORIES[name] = factory


def build(name: str, settings: Settings, *, fallback: bool = True) -> Backend:
    """The backend ``name``, wrapped with ``settings.fallback`` when that list applies.

    Fallback order: the backends listed after ``name`` (all of them when ``name`` is not
    listed); they take a turn only when the one before is unreachable.
    """
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(available())}") from None
    backend = factory(settings)
    order = settings.fallback
    rest = order[order.index(name) + 1 :] if name in order else list(order)
    if not fallback or not rest:
        return backend
    from contemplation.backends.fallback import FallbackBackend

    return FallbackBackend([backend, *(build(n, settings, fallback=False) for n in rest)])


async def check_all(settings: Settings, extra: Iterable[str] = ()) -> list[Check]:
    """``doctor``: check the default backend (with the default model), its fallbacks and
    ``extra`` backends (e.g. those named in conversations' metadata), concurrently."""
    import asyncio

    from contemplation.backends.base import Check

    names = list(dict.fromkeys([settings.default_backend, *settings.fallback, *extra]))

    async def one(name: str) -> list[Check]:
        try:
            backend = build(name, settings, fallback=False)
        except ConfigError as exc:
            return [Check(name, False, str(exc))]
        model = settings.default_model if name == settings.default_backend else None
        try:
            return await backend.check(model)
        except Exception as exc:  # a broken check is a failed check, not a crashed doctor
            return [Check(name, False, f"the check failed: {type(exc).__name__}: {exc}")]
        finally:
            await backend.aclose()

    results = await asyncio.gather(*(one(n) for n in names))
    return [c for checks in results for c in checks]
