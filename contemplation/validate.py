"""One validation of a configuration, run by ``run`` (a bad value stops the start) and by
``doctor`` (which reports the same line), so the two can never disagree.

Loading the settings already checks every value's type and form (URLs, ranges), naming the
key and where it was set. This adds what needs the rest of the package: backend names exist,
the route table and every template's rules compile, and templates hold only known keys.
"""

from __future__ import annotations

import contextlib
import ipaddress

from contemplation import backends
from contemplation.errors import ConfigError, NotFound
from contemplation.layout import Home, load_template
from contemplation.needs.router import NeedRouter
from contemplation.settings import Settings


def _backend_name(settings: Settings, key: str, name: str) -> None:
    if name not in backends.available():
        raise ConfigError(
            f"invalid setting {key} in {settings.source(key)}: unknown backend {name!r}; "
            f"known: {', '.join(backends.available())}"
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


def validate(settings: Settings) -> NeedRouter:
    """Raise :class:`ConfigError` (one line: key and source) on the first bad value; returns
    the checked need router, ready for the daemon to use."""
    _backend_name(settings, "default_backend", settings.default_backend)
    for name in settings.fallback:
        _backend_name(settings, "fallback", name)
    _dashboard_host(settings)
    router = NeedRouter(settings)  # the [[routes]] table and the search tool
    home = Home(settings.home)
    names: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        names = sorted(p.name for p in home.templates.iterdir() if p.is_dir())
    for name in {settings.default_template, *names}:
        try:
            tpl = load_template(home, name)  # unknown keys are refused here
        except NotFound as exc:
            if name == settings.default_template:
                raise ConfigError(
                    f"invalid setting default_template in "
                    f"{settings.source('default_template')}: {exc}"
                ) from None
            continue
        if tpl.backend and tpl.backend not in backends.available():
            raise ConfigError(
                f"invalid backend {tpl.backend!r} in template {name} ({home.templates / name}): "
                f"known: {', '.join(backends.available())}"
            )
        router.rules(name)  # its routes compile
    return router
