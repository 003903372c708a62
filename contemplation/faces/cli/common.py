"""What every command of the CLI shares: the settings, the one conversation lookup, output,
exit codes, and shell completion of conversation ids and template names.

Command groups in other modules (``cli_routes``, ``cli_service``, ...) take their settings
from :func:`ctx_settings` so that ``--home``, ``--config`` and ``-v`` given to
``contemplation`` apply to them too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from contemplation.base import acting
from contemplation.base.exits import (
    EXIT_CODES,
    EXIT_CUT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NEEDS_AGENT,
    EXIT_OK,
    EXIT_TIMEOUT,
    fail,
)
from contemplation.base.terminal import safe
from contemplation.errors import ContemplationError
from contemplation.faces.cli import light
from contemplation.store.layout import Conv, Home, valid_id

if TYPE_CHECKING:
    from importlib.abc import Loader

    from click.shell_completion import CompletionItem

    from contemplation.settings import Settings
    from contemplation.store.waiting import Face

__all__ = [
    "EXIT_CODES", "EXIT_CUT", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NEEDS_AGENT", "EXIT_OK",
    "EXIT_TIMEOUT", "fail",
]  # fmt: skip

SERVICES = frozenset({"run", "mcp"})  # commands whose stderr is a log (log_format's)
COMPLETIONS_MAX = 500  # candidates offered to the shell at most

F = TypeVar("F", bound=Callable[..., Any])


def face() -> Face:
    """Whose words this CLI process speaks: the agent's when an agent's shell runs it (no
    decision of the person's is handed to it as a command), else the person's."""
    return "agent" if acting.here().is_agent else "cli"


def ctx_settings(ctx: click.Context) -> Settings:
    """The settings (file < environment < flags), loaded once per invocation; diagnostics
    are configured to go to stderr, never into a command's output. The model's verdict is
    remembered for the read commands (:mod:`contemplation.faces.cli.light`)."""
    from contemplation.settings import load

    obj: dict[str, Any] = ctx.find_root().ensure_object(dict)
    if "settings" not in obj:
        given = _given(obj)
        s = load(**given)
        light.remember(s, **given)
        obj["light"] = light.of(s)
        _configure(ctx, obj["light"])
        obj["settings"] = s
    settings: Settings = obj["settings"]
    return settings


def ctx_light(ctx: click.Context) -> light.Light:
    """What a read command uses of the settings (the home, the log, the search's time, the
    alias names), without the settings model where its verdict on these inputs is known
    (:mod:`contemplation.faces.cli.light`); else the model is loaded (and says what is bad)."""
    obj: dict[str, Any] = ctx.find_root().ensure_object(dict)
    if "light" not in obj:
        found = light.load(**_given(obj))
        if found is None:
            ctx_settings(ctx)
        else:
            _configure(ctx, found)
            obj["light"] = found
    got: light.Light = obj["light"]
    return got


def _given(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "config": obj.get("config"),
        "home": obj.get("home"),
        "overrides": obj.get("overrides") or {},
    }


def _configure(ctx: click.Context, values: light.Light) -> None:
    """Diagnostics set up (:func:`contemplation.base.logs.configure`) before the first line
    can be said: now when structlog is loaded, else the moment it is (a read command that
    says nothing never loads it)."""
    service = ctx.find_root().invoked_subcommand in SERVICES  # their stderr is a log

    def configure() -> None:
        from contemplation.base.logs import configure

        configure(values.log_format, values.log_level, human_lines=not service)

    if "structlog" in sys.modules or not logs_later(configure):
        configure()


def logs_later(configure: Callable[[], None]) -> bool:
    """Run ``configure`` as soon as :mod:`contemplation.base.logs` has been imported (which
    imports structlog); whoever imports structlog first imports that module right after it.
    False when the import system cannot be watched (then configure now)."""
    import importlib
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    watched = {"structlog", "contemplation.base.logs"}

    # the import protocols by their methods: importlib.abc costs every command ~2 ms
    class Then:
        def __init__(self, inner: Loader, name: str) -> None:
            self.inner, self.name = inner, name

        def create_module(self, spec: ModuleSpec) -> ModuleType | None:
            return self.inner.create_module(spec)

        def exec_module(self, module: ModuleType) -> None:
            self.inner.exec_module(module)
            if self.name != "structlog":
                sys.meta_path.remove(finder)
                configure()
            elif "contemplation.base.logs" not in sys.modules:  # not already on its way
                importlib.import_module("contemplation.base.logs")

    class Finder:
        def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
            if name not in watched:
                return None
            for other in sys.meta_path:
                if other is self or not hasattr(other, "find_spec"):
                    continue
                spec: ModuleSpec | None = other.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = cast("Loader", Then(spec.loader, name))
                    return spec
            return None

    finder = Finder()
    sys.meta_path.insert(0, finder)
    return True


def quiet_logs_unless_verbose(ctx: click.Context) -> None:
    """Call before :func:`ctx_settings`: info lines only with ``contemplation -v``."""
    overrides = ctx.find_root().ensure_object(dict).setdefault("overrides", {})
    overrides.setdefault("log_level", "warning")


def ctx_home(ctx: click.Context) -> Home:
    return Home(ctx_light(ctx).home)


def lookup(ctx: click.Context, name: str) -> Conv:
    """The conversation every command means by ``name`` (see :func:`layout.locate`): an
    archived one is found too; the actions that would change it say it is archived."""
    from contemplation.store.layout import locate

    return locate(ctx_home(ctx), name)


def text_arg(text: str) -> str:
    """TEXT, or stdin for ``-``."""
    return sys.stdin.read() if text == "-" else text


def emit(data: Any, as_json: bool, human: str) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    else:
        click.echo(safe(human))  # model text never drives the terminal


def json_option(help: str = "Print the data as JSON instead of text.") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


# --------------------------------------------------------------------------- completion


def _completion_home(ctx: click.Context) -> Home | None:
    """The home the command line names, for completion (no callback has run yet)."""
    params = ctx.find_root().params
    given: dict[str, Any] = {"config": params.get("config"), "home": params.get("home")}
    found = light.load(**given)
    if found is not None:
        return Home(found.home)
    from contemplation.settings import load

    try:
        s = load(**given, overrides={})
    except (ContemplationError, OSError, ValueError):
        return None
    return Home(s.home)


def _names(folder: Path, keep: Callable[[Path], bool]) -> list[str]:
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p.name for p in entries if keep(p)]


def conversation_ids(home: Home) -> list[str]:
    """Ids of active, then completed conversations."""
    return [
        name
        for folder in (home.active, home.completed)
        for name in _names(folder, lambda p: valid_id(p.name) and p.is_dir())
    ]


def template_names(home: Home) -> list[str]:
    """The home's templates and the shipped ones (``default``)."""
    from contemplation.store.templates import shipped_templates

    shipped = shipped_templates()
    found = [
        name
        for folder in (home.templates, shipped)
        for name in _names(folder, lambda p: (p / "template.toml").is_file())
    ]
    return sorted(set(found))


class _Completed(click.types.StringParamType):
    """A plain string that the shell completes from what is in the home."""

    def __init__(self, name: str, candidates: Callable[[Home], list[str]]) -> None:
        self.name = name
        self._candidates = candidates

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        home = _completion_home(ctx)
        if home is None:
            return []
        hits = [n for n in self._candidates(home) if n.startswith(incomplete)]
        return [CompletionItem(n) for n in hits[:COMPLETIONS_MAX]]


CONVERSATION = _Completed("conversation", conversation_ids)
TEMPLATE = _Completed("template", template_names)
