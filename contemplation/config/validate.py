"""One validation of a configuration, run by ``run`` (a bad value stops the start) and by
``doctor`` (which reports the same line), so the two can never disagree.

Loading the settings already checks every value's type and form (URLs, ranges), naming the
key and where it was set. This adds what needs the rest of the package: backend names exist,
the route table and every template's rules compile, and templates (the home's and the shipped
ones) hold only known keys with values of the right form, a known backend and context
requirements of known types.
"""

from __future__ import annotations

import ipaddress

from contemplation import backends
from contemplation.backends import providers
from contemplation.errors import ConfigError, NotFound
from contemplation.needs.router import NeedRouter
from contemplation.prompt import context_kinds
from contemplation.settings import Settings, check_kinds
from contemplation.store.layout import Home
from contemplation.store.templates import Template, load_template, template_dirs


def _backend_name(settings: Settings, key: str, name: str) -> None:
    if not backends.named(settings, name):
        raise ConfigError(
            f"invalid setting {key} in {settings.source(key)}: {backends.unknown(settings, name)}"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _dashboard_host(settings: Settings) -> None:
    host = settings.dashboard_host
    if settings.dashboard_enabled and not is_loopback(host) and not settings.dashboard_allow_remote:
        raise ConfigError(
            f"invalid setting dashboard_host in {settings.source('dashboard_host')}: {host!r} is "
            "not a loopback address; set dashboard_allow_remote = true to serve other machines "
            "(every read then needs the token too)"
        )


def check_template(tpl: Template, settings: Settings) -> None:
    """What loading a template cannot check alone: its backend exists (a backend kind, or a
    provider or an alias of ``settings``: the one check ``templates``, ``templates show``,
    ``new``, ``run`` and ``doctor`` all make) and its context requirements are of known
    types. Raises :class:`ConfigError` naming the template."""
    where = tpl.folder / "template.toml" if tpl.folder else tpl.name
    if tpl.backend and not backends.named(settings, tpl.backend):
        names = sorted({*backends.available(), *settings.providers, *settings.aliases})
        raise ConfigError(
            f"invalid backend {tpl.backend!r} in template {tpl.name} ({where}): "
            f"known: {', '.join(names)}"
        )
    for n, req in enumerate(tpl.context_requirements, 1):
        kind = req.get("type")
        if kind not in (known := context_kinds.kinds()):
            raise ConfigError(
                f"invalid context_requirements in template {where}: entry {n} has type "
                f"{kind!r}; known: {', '.join(sorted(known))}"
            )


def unset_sources(settings: Settings) -> list[str]:
    """Each template that gathers from a source this configuration has not set up, with the
    setting to change: the person's to read (``doctor``). The model is told only that the
    source is not available."""
    tools = settings.tools
    missing = {
        "notes": None if tools.notes_vault else ("notes", "a notes vault", "tools.notes_vault"),
        "files": None if tools.allowed_roots else ("files", "a folder", "tools.allowed_roots"),
        "code_structure": None
        if tools.allowed_roots
        else ("a folder's layout", "a folder", "tools.allowed_roots"),
    }
    home = Home(settings.home)
    out: list[str] = []
    for name in sorted(template_dirs(home)):
        try:
            tpl = load_template(home, name)
        except (ConfigError, NotFound):
            continue  # reported by validate()
        kinds = dict.fromkeys(str(r.get("type")) for r in tpl.context_requirements)
        for kind in kinds:
            if (gap := missing.get(kind)) is not None:
                what, source, key = gap
                out.append(
                    f"{name} gathers {what}, but no {source.removeprefix('a ')} is "
                    f"set: set {key} in the config"
                )
    return out


def validate(settings: Settings) -> NeedRouter:
    """Raise :class:`ConfigError` (one line: key and source) on the first bad value; returns
    the checked need router, ready for the daemon to use."""
    check_kinds(settings, backends.known, backends.available())
    _backend_name(settings, "default_backend", settings.default_backend)
    for name in settings.fallback:
        _backend_name(settings, "fallback", name)
    # every provider's table, each checked by its kind's own model (built-in or plugin)
    for name in dict.fromkeys((*settings.providers, *providers.SECTIONS, *settings.plugins)):
        backends.config(settings, name)
    _dashboard_host(settings)
    router = NeedRouter(settings)  # the [[routes]] table and the search tool
    home = Home(settings.home)
    for name in {settings.default_template, *template_dirs(home)}:
        try:
            tpl = load_template(home, name)  # unknown keys and bad values are refused here
        except NotFound as exc:
            if name == settings.default_template:
                raise ConfigError(
                    f"invalid setting default_template in "
                    f"{settings.source('default_template')}: {exc}"
                ) from None
            continue
        check_template(tpl, settings)
        router.rules(name)  # its routes compile
    return router
