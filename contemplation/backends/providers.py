"""Where a conversation's turns go: providers (servers by name) and aliases (a model name over
one or more providers, with options).

``metadata.json``'s ``backend`` names a provider or an alias; ``model`` names the server's
model, or an alias (``new --model coder``). The ``[ollama]``, ``[openai]``, ``[opencode]`` and
``[local]`` sections are the providers of those names unless ``[providers.<name>]`` says
otherwise, so configs written before providers existed keep working. A plugin's backend kind
named directly (``--backend echo``) is a provider of that name too.

Pure: settings in, a :class:`Target` out. Nothing here talks to a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from contemplation.base.backend_kinds import NAMES
from contemplation.settings import AliasSettings, Settings

# the sections written before providers existed: each is the provider of its name and kind
SECTIONS = NAMES


@dataclass(frozen=True, slots=True)
class Target:
    """Where one conversation's turns go: the providers that may serve it (in the configured
    order: the least busy free one is taken, ties in this order), the server's model name, and
    what the alias adds (options under the conversation's own, think when it has none)."""

    providers: tuple[str, ...]
    model: str
    alias: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    think: bool | str | None = None


def _alias_of(settings: Settings, backend: str, model: str) -> tuple[str, AliasSettings] | None:
    """The alias a conversation names: its backend (``--backend coder``), else its model."""
    for name in (backend, model):
        found = settings.aliases.get(name)
        if found is not None:
            return name, found
    return None


def target(
    settings: Settings,
    backend: str,
    model: str,
    *,
    options: dict[str, Any] | None = None,
    think: bool | str | None = None,
) -> Target:
    """Resolve a conversation's ``backend`` and ``model``. An alias's providers apply when
    the backend is the alias (``new --model coder`` records that); an alias named only as
    the model (``--backend box1 --model coder``) lends its model, options and think to the
    provider named."""
    found = _alias_of(settings, backend, model)
    if found is None:
        return Target((backend,), model, options=dict(options or {}), think=think)
    name, alias = found
    where = tuple(alias.providers) if backend == name else (backend,)
    served = alias.model if model in {name, backend} else model
    return Target(
        where,
        served,
        alias=name,
        options={**alias.options, **(options or {})},
        think=think if think is not None else alias.think,
    )


class Table(NamedTuple):
    """A provider's kind and its own keys as written (its kind's model checks them), and
    where they are in the settings (``("providers", "box1")``), for errors."""

    kind: str
    raw: dict[str, Any]
    at: tuple[str, ...]


def table(settings: Settings, name: str) -> Table:
    """The settings of the provider ``name``: ``[providers.<name>]``, else the old section
    of that name (``[ollama]``), else a kind named directly with its ``[plugins.<name>]``."""
    found = settings.providers.get(name)
    if found is not None:
        return Table(found.kind, found.own(), ("providers", name))
    if name in SECTIONS:
        return Table(name, dict(getattr(settings, name)), (name,))
    return Table(name, dict(settings.plugins.get(name, {})), ("plugins", name))
