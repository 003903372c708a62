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
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

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
from contemplation.base.logs import configure
from contemplation.base.terminal import safe
from contemplation.errors import ContemplationError
from contemplation.faces.reading import locate
from contemplation.settings import Settings, load
from contemplation.store.layout import Conv, Home, valid_id
from contemplation.store.templates import shipped_templates
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
    are configured to go to stderr, never into a command's output."""
    obj: dict[str, Any] = ctx.find_root().ensure_object(dict)
    if "settings" not in obj:
        s = load(
            config=obj.get("config"), home=obj.get("home"), overrides=obj.get("overrides") or {}
        )
        service = ctx.find_root().invoked_subcommand in SERVICES  # their stderr is a log
        configure(s.log_format, s.log_level, human_lines=not service)
        obj["settings"] = s
    settings: Settings = obj["settings"]
    return settings


def quiet_logs_unless_verbose(ctx: click.Context) -> None:
    """Call before :func:`ctx_settings`: info lines only with ``contemplation -v``."""
    overrides = ctx.find_root().ensure_object(dict).setdefault("overrides", {})
    overrides.setdefault("log_level", "warning")


def ctx_home(ctx: click.Context) -> Home:
    return Home(ctx_settings(ctx).home)


def lookup(ctx: click.Context, name: str) -> Conv:
    """The conversation every command means by ``name`` (see :func:`reading.locate`): an
    archived one is found too; the actions that would change it say it is archived."""
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
    try:
        s = load(config=params.get("config"), home=params.get("home"), overrides={})
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
        home = _completion_home(ctx)
        if home is None:
            return []
        hits = [n for n in self._candidates(home) if n.startswith(incomplete)]
        return [CompletionItem(n) for n in hits[:COMPLETIONS_MAX]]


CONVERSATION = _Completed("conversation", conversation_ids)
TEMPLATE = _Completed("template", template_names)
