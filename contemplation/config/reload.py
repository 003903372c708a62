"""Configuration changes without a restart (SIGHUP, ``contemplation service reload``).

The daemon re-reads its settings from the same sources it started with. A new file that does
not load or validate is refused with one log line and the old settings stay. Otherwise the
new settings take effect for every turn that starts from then on (turns in flight finish on
the clients they started with); a backend whose settings changed gets new clients, and the
conversations waiting out a backoff for it retry at once. What cannot change while running
(the home, the dashboard's address) is named in one line: those need a restart.

The settings a daemon runs with are fingerprinted into its info file, so ``doctor`` can say
when the file on disk says something else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from contemplation.errors import ContemplationError
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_json

#: settings that a running daemon cannot take over (its home, its dashboard's socket)
RESTART_KEYS = ("home", "dashboard_enabled", "dashboard_host", "dashboard_port", "durability")
#: settings whose change means new clients for a backend family (besides its own section)
BACKEND_WIDE = ("fallback", "capabilities", "max_reply_bytes")


def fingerprint(settings: Settings) -> str:
    """A hash of everything the settings say (secrets enter only through the hash)."""
    data = settings.model_dump(mode="json")
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def backend_fingerprint(settings: Settings, family: str) -> str:
    """A hash of what a backend family's clients are made from: a backoff recorded with it is
    cut short once the settings say something else (a reload, or a restart after an edit)."""
    data = {
        "section": _section(settings, family),
        **{k: getattr(settings, k) for k in BACKEND_WIDE},
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Change:
    settings: Settings
    backends: frozenset[str]  # backend families whose clients must be made anew
    restart: tuple[str, ...]  # keys that changed but take a restart


def compare(old: Settings, new: Settings, families: list[str]) -> Change:
    """What a reload from ``old`` to ``new`` changes."""
    families = names(old, new, families)
    wide = any(getattr(old, k) != getattr(new, k) for k in BACKEND_WIDE)
    changed = frozenset(
        f
        for f in families
        if wide or _section(old, f) != _section(new, f) or f in _default_change(old, new)
    )
    restart = tuple(k for k in RESTART_KEYS if getattr(old, k) != getattr(new, k))
    return Change(new, changed, restart)


def _section(settings: Settings, name: str) -> Any:
    """What provider ``name``'s clients are made from; for an alias, its own keys and each
    of its providers'."""
    from contemplation.backends import providers

    alias = settings.aliases.get(name)
    if alias is not None:
        return {
            "alias": alias.model_dump(mode="json"),
            "providers": {p: _section(settings, p) for p in alias.providers},
        }
    return providers.table(settings, name)


def names(old: Settings, new: Settings, families: list[str]) -> list[str]:
    """Every name a conversation's backend may say: kinds, providers and aliases, old and new."""
    return list(
        dict.fromkeys([*families, *old.providers, *new.providers, *old.aliases, *new.aliases])
    )


def _default_change(old: Settings, new: Settings) -> set[str]:
    return (
        {old.default_backend, new.default_backend}
        if old.default_model != new.default_model
        else set()
    )


def load_new(loader: Callable[[], Settings], check: Callable[[Settings], Any]) -> Settings:
    """The settings read anew and checked as a start checks them; ContemplationError (one
    line) when the file does not load or a value is refused."""
    try:
        new = loader()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ContemplationError(f"{where}: {first.get('msg', 'invalid')}") from None
    check(new)
    return new


def drift(home: Home, settings: Settings, *, valid: bool = True) -> str | None:
    """A line when the running daemon's settings differ from ``settings`` (None: the same, or
    no daemon, or one too old to say). ``valid``: whether ``settings`` pass the check a reload
    makes; a reload that would be refused is not suggested."""
    info = read_json(home.daemon_info) or {}
    running = info.get("settings")
    if not running or running == fingerprint(settings):
        return None
    pid = info.get("pid", "?")
    source = settings.config_file or "the environment"
    if not valid:
        return (
            f"the running daemon (pid {pid}) runs other settings than {source} says, but "
            f"{source} does not validate (see the config check): a reload would be refused, "
            "so fix it first"
        )
    return (
        f"the running daemon (pid {pid}) runs other settings than {source} says: reload it "
        f"with `contemplation service reload` (or `kill -HUP {pid}`)"
    )
