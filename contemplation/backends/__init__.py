"""Backend kinds by name: one registry, the built-ins registered through it like a plugin's.

A :class:`BackendKind` says, in one place, what the rest of the daemon needs of a kind: its
name (a provider's ``kind``; named directly, ``--backend ollama``, a provider of its own), the
pydantic model of its settings, and how a backend is made from them. Each built-in kind is a
sibling module that declares ``KIND`` (:data:`BUILT_IN` lists them: adding one is its module,
its name there, and its test). A plugin adds a kind through an entry point in the group
``contemplation.backends`` naming a :class:`BackendKind` (or a callable that returns one or
several); it is read only when a name is asked for that no built-in kind has, or when every
kind is listed (the entry points cost about 25 ms).

Where a provider's settings come from (:func:`contemplation.backends.providers.table`):
``[providers.<name>]``, else the ``[ollama]``-style section of a built-in kind's name, else
``[plugins.<name>]``. The kind's model checks them when the provider is made or validated;
a bad key is one line naming it and where it was set. Nothing here imports a kind's module,
or aiohttp, until a kind is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contemplation.base import backend_kinds, plugins
from contemplation.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
    from contemplation.settings import Settings, TimeoutSettings

__all__ = [
    "Backend",
    "BackendInputs",
    "BackendKind",
    "Capabilities",
    "Check",
    "PhaseTimeouts",
    "available",
    "build",
    "check_all",
    "config",
    "known",
]  # fmt: skip

_BASE_NAMES = frozenset({"Backend", "Capabilities", "Check", "PhaseTimeouts"})
BUILT_IN = backend_kinds.NAMES  # each a sibling module declaring KIND
GROUP = "contemplation.backends"


def __getattr__(name: str) -> Any:
    """The base types, imported when first asked for (``backends.Backend``)."""
    if name in _BASE_NAMES:
        from contemplation.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class BackendInputs:
    """What a backend is made from: the daemon's settings, the provider's name (the log's
    label) and its own settings (checked by the kind's ``settings_model``; without one, the
    table as a dict). For a plugin's kind, ``timeouts`` are the bounds the daemon holds its
    backend to (the table's ``timeouts``, taken out before the kind's model sees it)."""

    settings: Settings
    name: str
    own: Any
    timeouts: TimeoutSettings | None = None


@dataclass(frozen=True, slots=True)
class BackendKind:
    """A backend kind: its name, how one is made, and the pydantic model of its settings."""

    name: str
    make: Callable[[BackendInputs], Backend]
    settings_model: type[BaseModel] | None = None


def _builtins() -> list[BackendKind]:
    return [importlib.import_module(f"{__name__}.{name}").KIND for name in BUILT_IN]


def _adopt(kind: BackendKind, origin: str) -> BackendKind:
    """A plugin's kind makes backends held to the usual bounds (:mod:`.guard`)."""
    if origin in (plugins.BUILT_IN, plugins.IN_PROCESS):
        return kind

    def guarded(m: BackendInputs) -> Backend:
        from contemplation.backends.base import phase_timeouts
        from contemplation.backends.guard import Guarded
        from contemplation.base.contained import described
        from contemplation.settings import TimeoutSettings

        bounds = phase_timeouts(m.timeouts or TimeoutSettings(), m.settings.max_reply_bytes)
        plugin = f"{kind.name} ({origin})"
        try:
            made = kind.make(m)
        except BaseException as exc:  # the plugin's bug (sys.exit too): one line, where used
            raise ConfigError(
                f"the plugin {plugin} could not make its backend: {described(exc)}"
            ) from exc
        return Guarded(made, plugin, bounds)

    return BackendKind(kind.name, guarded, kind.settings_model)


KINDS: plugins.Registry[BackendKind] = plugins.Registry(GROUP, BackendKind, _builtins, _adopt)
origins, failures = KINDS.origins, KINDS.failures


def known(name: str) -> bool:
    """Whether a backend kind of this name exists (a built-in's name reads nothing)."""
    return name in BUILT_IN or KINDS.get(name) is not None


def available() -> list[str]:
    """Every kind, the plugins' too."""
    return sorted(KINDS.kinds())


def named(settings: Settings, name: str) -> bool:
    """Whether a conversation may name ``name``: a provider, an alias or a backend kind."""
    return name in settings.providers or name in settings.aliases or known(name)


def unknown(settings: Settings, name: str) -> ConfigError:
    """The one line for a name that is none of those, with every name that is."""
    names = sorted({*available(), *settings.providers, *settings.aliases})
    return ConfigError(f"unknown backend {name!r}; known: {', '.join(names)}")


def register(name: str, factory: Callable[[Settings], Backend]) -> None:
    """Put an in-process kind in place (tests and benchmarks: their fakes)."""
    KINDS.replace(BackendKind(name, lambda m: factory(m.settings)))


def config(settings: Settings, name: str) -> tuple[BackendKind, Any]:
    """The provider ``name``'s kind and its settings, checked by the kind's model: one line
    naming the key and where it was set when they are wrong, or when no kind has the name."""
    kind, own, _ = _resolved(settings, name)
    return kind, own


def _resolved(settings: Settings, name: str) -> tuple[BackendKind, Any, TimeoutSettings | None]:
    """:func:`config`, and for a plugin's kind the ``timeouts`` its table gives the guard."""
    from pydantic import ValidationError

    from contemplation.backends import providers
    from contemplation.settings import TimeoutSettings

    table = providers.table(settings, name)
    kind = KINDS.get(table.kind)
    if kind is None:
        key = ".".join(table.at)
        if table.at[0] == "providers":
            raise ConfigError(
                f"invalid setting {key}.kind in {settings.source(key + '.kind')}: no backend "
                f"kind {table.kind!r}; known: {', '.join(available())}"
            )
        if table.at[0] == "plugins" and name in settings.plugins:
            raise ConfigError(
                f"[{key}] in {settings.source(key)}: no installed plugin has a backend named "
                f"{name!r}"
            )
        raise unknown(settings, name)
    raw = dict(table.raw)
    bounds = None
    if table.kind not in BUILT_IN:  # the daemon's bounds, taken out before the kind's model
        try:
            bounds = TimeoutSettings.model_validate(raw.pop("timeouts", {}))
        except ValidationError as exc:
            raise settings.refusal(exc, (*table.at, "timeouts")) from None
    if kind.settings_model is None:
        return kind, raw, bounds
    try:
        return kind, kind.settings_model.model_validate(raw), bounds
    except ValidationError as exc:
        raise settings.refusal(exc, table.at) from None


def make(name: str, settings: Settings) -> Backend:
    """The provider ``name`` (``[providers.<name>]``, an old section, a kind named directly)."""
    kind, own, bounds = _resolved(settings, name)
    return kind.make(BackendInputs(settings, name, own, bounds))


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
