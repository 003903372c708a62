"""What ``service install`` carries from the shell into the service, so that the daemon runs with
the settings the user tested with: the servers' own variables (``OLLAMA_HOST``,
``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ...; :data:`~contemplation.settings.SERVER_ENV`)
and every ``CONTEMPLATION_*`` but the home and the config file (the unit's ``--home`` and
``--config`` carry those). Nothing that is not set is written.

A value is *secret* when its name says so (``KEY``, ``TOKEN``, ``PASSWORD``...) or it is a
URL with a password in it. Secrets never go into the unit or the plist (both are world
readable, and ``systemctl cat`` / ``launchctl print`` show them): they go into one file of
mode 0600, ``$XDG_CONFIG_HOME/contemplation/service.env``, which the systemd unit names with
``EnvironmentFile=`` and the LaunchAgent's ``/bin/sh`` wrapper reads (``set -a; . FILE``)
before it execs the daemon. Its lines are ``NAME='value'``, read alike by systemd and sh.
What is carried is said with secrets masked (:data:`MASK`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from contemplation.base.secret_names import SERVICE_ENV
from contemplation.errors import ConfigError
from contemplation.settings import ENV_PREFIX, SERVER_ENV

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
BY_ARGS = frozenset({ENV_PREFIX + "HOME", ENV_PREFIX + "CONFIG"})  # --home / --config
MASK = "***"
FILE_NAME = SERVICE_ENV
_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)='([^'\n]*)'$")


def is_secret(name: str, value: str) -> bool:
    if any(word in name.upper() for word in SECRET_WORDS):
        return True
    try:
        return urlsplit(value).password is not None
    except ValueError:
        return False


def env_file() -> Path:
    """Where the secrets are kept (beside the user's other configuration, mode 0600)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "contemplation" / FILE_NAME


@dataclass(frozen=True, slots=True)
class Carried:
    public: dict[str, str]  # written into the unit / the plist
    secret: dict[str, str]  # written into the 0600 file only

    @property
    def all(self) -> dict[str, str]:
        return dict(sorted({**self.public, **self.secret}.items()))

    def file_text(self) -> str:
        return "".join(f"{k}='{v}'\n" for k, v in sorted(self.secret.items()))

    def lines(self, where: Path) -> list[str]:
        """What install says it carried (secret values masked)."""
        if not self.public and not self.secret:
            return ["carried: nothing from this shell (no OLLAMA_HOST, OPENAI_*, CONTEMPLATION_*)"]
        out = [f"carried: {k}={v}" for k, v in sorted(self.public.items())]
        out += [
            f"carried: {k}={MASK} (secret, in {where}, mode 0600)" for k in sorted(self.secret)
        ]
        return out


def carried(env: Mapping[str, str]) -> Carried:
    """The variables of ``env`` the service runs with; ConfigError (one line) for a value no
    unit can hold (a newline; a quote in a secret)."""
    public: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name in sorted(env):
        value = env[name]
        if not value or not (
            name in SERVER_ENV or (name.startswith(ENV_PREFIX) and name not in BY_ARGS)
        ):
            continue
        if "\n" in value or "\r" in value:
            raise ConfigError(f"{name} holds a line break: a service cannot carry it")
        if is_secret(name, value):
            if "'" in value:
                raise ConfigError(f"{name} holds a ' : set it in the config file instead")
            secret[name] = value
        else:
            public[name] = value
    return Carried(public, secret)


def parse_file(text: str) -> dict[str, str]:
    """The secrets of a file :meth:`Carried.file_text` wrote (other lines are skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m[1]] = m[2]
    return out


def differences(now: Carried, installed: Mapping[str, str]) -> list[str]:
    """The names whose values differ between the shell (``now``) and the installed service,
    each with how (never a value)."""
    shell = now.all
    out: list[str] = []
    for name in sorted({*shell, *installed}):
        if name not in installed:
            out.append(f"{name} (only in this shell)")
        elif name not in shell:
            out.append(f"{name} (only in the service)")
        elif shell[name] != installed[name]:
            out.append(f"{name} (differs)")
    return out
