"""What a read command needs of the settings (the home, the log's format and level, how long
a search may run, the alias names, the embedding server of ``[semantic]``), without building
the settings model.

Building :class:`contemplation.settings.Settings` (pydantic-settings) costs more than a read
command's whole work, so a read command (``list``, ``status``, ``tail``, ``search``,
``approvals``) resolves these values here, with the settings' own precedence and names:

* the home: ``--home``, else ``CONTEMPLATION_HOME``, else ``home`` in the config file, else
  the platform data folder, then ``~`` expanded and made absolute, as the model does;
* the config file: ``--config``, else ``CONTEMPLATION_CONFIG``, else the platform config
  folder's ``config.toml``.

Every setting is still checked by the model, once per set of inputs: a full load that
succeeds records its verdict (the other values read commands use) under a key made of
everything the model reads: the config file's path and bytes, every ``CONTEMPLATION_*``
variable and server variable, the flags, and this version of the code that checks them.
A command whose inputs have such a verdict uses it; any other (a new or edited config file,
a changed variable, a value this module does not read plainly) loads the model, so a bad value
is refused by every command with the model's own line, as before. The verdicts live in the
user's cache folder (at most :data:`KEPT` of them); losing them costs one full load.

``tests/unit/faces/test_cli_light.py`` proves this path and the model agree.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import platformdirs

from contemplation import __version__
from contemplation.base.backend_kinds import SERVER_ENV_BY_KIND

if TYPE_CHECKING:
    from contemplation.settings import Settings

APP = "contemplation"  # = settings.APP
ENV_PREFIX = "CONTEMPLATION_"  # = settings.ENV_PREFIX
SERVER_NAMES = frozenset(name for env in SERVER_ENV_BY_KIND.values() for name in env)
KEPT = 16  # verdicts kept; the oldest goes first
VERDICTS = "settings-checked.json"
# the modules whose code decides what the model accepts: a change to one is a new verdict
# (tests/unit/faces/test_cli_light.py checks this names every module settings.py imports)
CHECKERS = (
    "settings.py",
    "errors.py",
    "base/backend_kinds.py",
    "base/redact.py",
    "protocol/escalation.py",
)
_PACKAGE = Path(__file__).resolve().parents[2]
LogFormat = Literal["auto", "console", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
FORMATS: tuple[LogFormat, ...] = ("auto", "console", "json")
LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning", "error")


@dataclass(frozen=True, slots=True)
class Light:
    """The values a read command uses, as the settings model would give them."""

    home: Path
    log_format: LogFormat
    log_level: LogLevel
    search_seconds: float
    aliases: frozenset[str]  # the configured alias names (a model named so is an alias)
    # [semantic]'s embedding server: url, model, api, timeout (url "": the offline model)
    embed: tuple[str, str, str, float] = ("", "", "ollama", 30.0)


def default_config_path() -> Path:
    """= :func:`contemplation.settings.default_config_path`."""
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


def verdicts_path() -> Path:
    return Path(platformdirs.user_cache_dir(APP)) / VERDICTS


@dataclass(frozen=True, slots=True)
class Inputs:
    """Everything :func:`contemplation.settings.load` reads, as one key."""

    key: str
    config: dict[str, Any]  # the file's table ({} without a file)


def inputs(
    config: Path | None,
    home: Path | None,
    overrides: Mapping[str, Any],
    env: Mapping[str, str],
) -> Inputs | None:
    """The key of what the model would read, or None where the model must say what is
    wrong (a named config file missing, not a file, unreadable, not TOML)."""
    named = env.get(ENV_PREFIX + "CONFIG")
    path = config if config is not None else Path(named) if named else default_config_path()
    path = path.expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if config is not None or named:
            return None
        data = None
    except OSError:  # not a file, no permission: the model's line says which
        return None
    table: dict[str, Any] = {}
    if data is not None:  # tomllib loads only for a file to read (~4 ms a command)
        import tomllib

        try:
            table = tomllib.loads(data.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
    read = sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIX) or k in SERVER_NAMES)
    stamp = [__version__, *(_stat(name) for name in CHECKERS)]
    key = [
        stamp,
        str(path),
        hashlib.sha256(data).hexdigest() if data is not None else None,
        read,
        None if home is None else str(home),
        sorted(overrides.items()),
    ]
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    return Inputs(digest, table)


def _stat(name: str) -> list[int]:
    try:
        st = (_PACKAGE / name).stat()
    except OSError:
        return []
    return [st.st_mtime_ns, st.st_size]


def resolve_home(
    home: Path | None, env: Mapping[str, str], table: Mapping[str, Any]
) -> Path | None:
    """The home by the settings' precedence (flag, variable, file, default), or None where
    this module would guess (a variable given twice in two cases, a home that is not text)."""
    if home is not None:
        raw: Any = str(home)
    else:
        given = [
            v
            for k, v in env.items()
            if k.startswith(ENV_PREFIX) and k.lower() == "contemplation_home"
        ]
        if len(given) > 1:
            return None
        raw = given[0] if given else table.get("home", None)
    if raw is None:
        raw = platformdirs.user_data_dir(APP)
    if not isinstance(raw, str):
        return None
    return Path(raw).expanduser().absolute()


def load(
    *,
    config: Path | None = None,
    home: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Light | None:
    """The read commands' values when these inputs were checked by the model before; None:
    load the model (:func:`contemplation.settings.load`) and :func:`remember` its verdict."""
    env = os.environ if env is None else env
    got = inputs(config, home, overrides or {}, env)
    if got is None:
        return None
    kept = _read_verdicts().get(got.key)
    where = resolve_home(home, env, got.config)
    if not isinstance(kept, dict) or where is None:
        return None
    if kept.get("log_format") not in FORMATS or kept.get("log_level") not in LEVELS:
        return None
    try:
        return Light(
            home=where,
            log_format=cast("LogFormat", kept["log_format"]),
            log_level=cast("LogLevel", kept["log_level"]),
            search_seconds=float(kept["search_seconds"]),
            aliases=frozenset(str(a) for a in kept["aliases"]),
            embed=_embed(kept["embed"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def of(settings: Settings) -> Light:
    """The read commands' values of a loaded model."""
    return Light(
        home=settings.home,
        log_format=settings.log_format,
        log_level=settings.log_level,
        search_seconds=settings.search_seconds,
        aliases=frozenset(settings.aliases),
        embed=settings.semantic.server(),
    )


def remember(
    settings: Settings,
    *,
    config: Path | None = None,
    home: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Record that the model accepted these inputs (and what it made of them), unless the
    cache folder cannot be written: then the next command loads the model again."""
    env = os.environ if env is None else env
    got = inputs(config, home, overrides or {}, env)
    if got is None:
        return
    values = of(settings)
    verdict = {
        "log_format": values.log_format,
        "log_level": values.log_level,
        "search_seconds": values.search_seconds,
        "aliases": sorted(values.aliases),
        "embed": list(values.embed),
    }
    verdicts = _read_verdicts()
    if verdicts.get(got.key) == verdict:
        return  # known already: a command that changes something writes nothing here
    verdicts.pop(got.key, None)
    verdicts[got.key] = verdict
    kept = dict(list(verdicts.items())[-KEPT:])
    from contemplation.writer.files import cache_write  # on a miss only

    path = verdicts_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        cache_write(path, json.dumps(kept, indent=2).encode())
    except OSError:
        pass  # a read-only cache: the model is loaded each time, nothing else changes


def _embed(kept: Any) -> tuple[str, str, str, float]:
    """A verdict's embedding server, as the model gave it (anything else: load the model)."""
    url, model, api, timeout = kept
    if not all(isinstance(v, str) for v in (url, model, api)) or api not in {"ollama", "openai"}:
        raise ValueError(kept)
    return (url, model, api, float(timeout))


def _read_verdicts() -> dict[str, Any]:
    try:
        data = json.loads(verdicts_path().read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
