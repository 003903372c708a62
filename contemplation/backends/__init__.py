"""Backends by name. Each family is a sibling module; :func:`build` picks one by its key.

A plugin adds a family through an entry point in the group ``contemplation.backends`` naming
a :class:`BackendKind` (or a callable that returns one or several): its name (what
``--backend`` and ``default_backend`` say), how it is made, and the pydantic model of its own
settings, read from ``[plugins.<name>]`` in config.toml (``CONTEMPLATION_PLUGINS__<NAME>__…``
in the environment). The entry points are read only when a name is asked for that no
built-in family has (they cost about 25 ms), or when every family is listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contemplation.errors import ConfigError

if TYPE_CHECKING:  # the families pull in aiohttp: a command that only names them does not
    from pydantic import BaseModel

    from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
    from contemplation.settings import Settings, TimeoutSettings

__all__ = [
    "Backend", "BackendKind", "Capabilities", "Check", "PhaseTimeouts", "available", "build",
    "check_all", "known",
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


def _ollama(settings: Settings, name: str, s: Any) -> Backend:
    from contemplation.backends.ollama import OllamaBackend
    from contemplation.settings import parse_ollama_host

    url, auth = parse_ollama_host(getattr(s, "url", "") or s.host)
    return OllamaBackend(
        url,
        auth=auth,
        num_ctx=s.num_ctx,
        keep_alive=s.keep_alive,
        timeouts=phase_timeouts(s.timeouts, settings.max_reply_bytes),
        concurrency=s.concurrency,
        overrides=settings.capabilities,
        name=name,
    )


def _openai(settings: Settings, name: str, s: Any) -> Backend:
    from contemplation.backends.openai import OpenAIBackend

    return OpenAIBackend(
        getattr(s, "url", "") or s.base_url,
        api_key=s.api_key,
        timeouts=phase_timeouts(s.timeouts, settings.max_reply_bytes),
        concurrency=s.concurrency,
        default_concurrency=s.default_concurrency,
        stream_usage=s.stream_usage,
        overrides=settings.capabilities,
        name=name,
    )


def _opencode(settings: Settings, name: str, s: Any) -> Backend:
    from contemplation.backends.opencode import OpenCodeBackend

    return OpenCodeBackend(
        s.url,
        auth=(s.username or "opencode", s.password) if s.password else None,
        tools=s.tools,
        agent=s.agent,
        timeouts=s.timeouts,
        concurrency=s.concurrency,
        overrides=settings.capabilities,
        name=name,
    )


def _local(settings: Settings, name: str, s: Any) -> Backend:
    from contemplation.backends.local import LocalBackend

    return LocalBackend(
        model_path=s.model_path,
        n_ctx=s.n_ctx,
        n_parallel=s.n_parallel,
        n_threads=s.n_threads,
        timeouts=phase_timeouts(s.timeouts),
        overrides=settings.capabilities,
        name=name,
    )


# a kind's maker: (the daemon's settings, the provider's name, its section) -> a backend
Maker = Callable[["Settings", str, Any], "Backend"]
_FACTORIES: dict[str, Maker] = {
    "ollama": _ollama,
    "openai": _openai,
    "opencode": _opencode,
    "local": _local,
}


_BUILT = frozenset(_FACTORIES)
GROUP = "contemplation.backends"
BUILT_IN = "built in"
_ORIGINS: dict[str, str] = dict.fromkeys(_FACTORIES, BUILT_IN)
_FAILED: list[tuple[str, str]] = []
_KINDS: dict[str, BackendKind] = {}  # the plugins' families
_plugins_read = False


@dataclass(frozen=True, slots=True)
class BackendKind:
    """A backend family from a plugin: ``make(settings, own)`` gets the daemon's settings and
    its own (``settings_model`` validated from ``[plugins.<name>]``; without a model, the
    section as a dict)."""

    name: str
    make: Callable[[Settings, Any], Backend]
    settings_model: type[BaseModel] | None = None


def _plugins() -> None:
    global _plugins_read  # noqa: PLW0603 - the entry points are read once per process
    if _plugins_read:
        return
    _plugins_read = True
    from contemplation import plugins

    def add(kind: BackendKind, dist: str) -> None:
        if kind.name in _FACTORIES:
            raise ValueError(f"a backend named {kind.name!r} exists already")
        _FACTORIES[kind.name] = _plugin_factory(kind)
        _ORIGINS[kind.name] = dist
        _KINDS[kind.name] = kind

    _FAILED.extend(plugins.load(GROUP, BackendKind, add))


def _plugin_factory(kind: BackendKind) -> Maker:
    def make(settings: Settings, name: str, section: Any) -> Backend:
        extra = dict(section.model_extra or {}) if section is not None else {}
        return kind.make(settings, own_settings(kind.name, settings, extra or None, name))

    return make


def own_settings(
    name: str, settings: Settings, raw: dict[str, Any] | None = None, provider: str = ""
) -> Any:
    """A plugin family's ``[plugins.<name>]`` (or a ``[providers.<provider>]`` of its kind),
    checked by its model (one line naming the key and the file when it is wrong); a section
    no installed plugin claims is refused too."""
    table = f"providers.{provider}" if raw is not None else f"plugins.{name}"
    raw = settings.plugins.get(name, {}) if raw is None else raw
    where = settings.config_file or "the settings"
    if not known(name) or name not in _KINDS:
        raise ConfigError(f"[{table}] in {where}: no installed plugin has a backend named {name!r}")
    model = _KINDS[name].settings_model
    if model is None:
        return raw
    from pydantic import ValidationError

    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(the section)"
        raise ConfigError(f"[{table}] {key} in {where}: {err['msg']}") from None


def known(name: str) -> bool:
    """Whether a backend family of this name exists (plugins read only if it is not built in)."""
    if name not in _FACTORIES:
        _plugins()
    return name in _FACTORIES


def named(settings: Settings, name: str) -> bool:
    """Whether a conversation may name ``name``: a provider, an alias or a backend kind."""
    return name in settings.providers or name in settings.aliases or known(name)


def unknown(settings: Settings, name: str) -> ConfigError:
    """The one line for a name that is none of those, with every name that is."""
    names = sorted({*available(), *settings.providers, *settings.aliases})
    return ConfigError(f"unknown backend {name!r}; known: {', '.join(names)}")


def available() -> list[str]:
    """Every family, the plugins' too."""
    _plugins()
    return sorted(_FACTORIES)


def origins() -> dict[str, str]:
    """Which distribution each family comes from (``built in`` for the package's own)."""
    _plugins()
    return {name: _ORIGINS.get(name, BUILT_IN) for name in sorted(_FACTORIES)}


def failures() -> list[tuple[str, str]]:
    _plugins()
    return list(_FAILED)


def register(name: str, factory: Callable[[Settings], Backend]) -> None:
    """Add a backend family (used by sibling modules and by tests for in-process fakes)."""
    _FACTORIES[name] = lambda settings, _name, _section: factory(settings)


def make(name: str, settings: Settings) -> Backend:
    """The provider ``name`` (``[providers.<name>]``, an old section, a plugin kind)."""
    from contemplation import providers

    section = providers.config(settings, name)
    if not known(section.kind):
        known_names = sorted({*available(), *settings.providers})
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(known_names)}")
    plugin_section = section if name in settings.providers else None
    return _FACTORIES[section.kind](
        settings, name, section if section.kind in _BUILT else plugin_section
    )


def build(name: str, settings: Settings, *, fallback: bool = True) -> Backend:
    """The provider ``name``, wrapped with ``settings.fallback`` when that list applies.

    Fallback order: the backends listed after ``name`` (all of them when ``name`` is not
    listed); they take a turn only when the one before is unreachable.
    """
    backend = make(name, settings)
    order = settings.fallback
    rest = order[order.index(name) + 1 :] if name in order else list(order)
    if not fallback or not rest:
        return backend
    from contemplation.backends.fallback import FallbackBackend

    return FallbackBackend([backend, *(build(n, settings, fallback=False) for n in rest)])


async def check_all(settings: Settings, extra: Iterable[str] = ()) -> list[Check]:
    """``doctor``: check the default backend (with the default model), its fallbacks, every
    ``[providers.*]`` and ``extra`` backends (e.g. those named in conversations' metadata;
    an alias stands for its providers), concurrently."""
    import asyncio

    from contemplation.backends.base import Check

    named = [settings.default_backend, *settings.fallback, *settings.providers, *extra]
    names: list[str] = []
    for name in named:  # an alias is checked as its providers
        alias = settings.aliases.get(name)
        names.extend(alias.providers if alias is not None else [name])
    names = list(dict.fromkeys(names))

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
