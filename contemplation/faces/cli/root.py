"""The command line's entry point: the main group and where each command lives.

A command's module is imported only when that command runs (or its help is asked for), so
``contemplation --help`` and every command pay only for what they use: the table below holds
each command's one-line help, which ``--help`` prints without importing anything
(``tests/system/test_startup.py`` checks both the lightness and that these lines match the
commands).
Errors are one line on stderr and a non-zero exit (:mod:`contemplation.base.exits`). Once a
command is done the process ends within a bound, whatever threads a plugin left running
(:mod:`contemplation.base.ending`).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from contemplation import __version__
from contemplation.base.exits import EXIT_CODES, EXIT_INTERRUPTED, disk_full, fail
from contemplation.base.privacy import private_umask
from contemplation.errors import ContemplationError

PROG = "contemplation"

#: name → (module, attribute, the one-line help ``--help`` shows)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "aliases": ("models", "aliases", "The model aliases of [aliases.*]: what..."),
    "approve": ("conv", "approve", "Decide about a lookup that waits for..."),
    "approvals": ("approvals", "approvals", "The decisions about lookups (once, always,..."),
    "archive": (
        "conv",
        "archive_",
        "Move a conversation to completed/; prints...",
    ),
    "cancel": ("conv", "cancel", "Stop the in-flight generation and mark the..."),
    "continue": ("recover", "continue_", "Have the model go on with its last reply..."),
    "doctor": ("daemon", "doctor", "Check the home, the config and every..."),
    "fork": ("fork", "fork", "Start a new conversation from blocks 1..N..."),
    "install": ("install", "install", "Install contemplation into Claude Code (a..."),
    "ledger": ("ledger", "ledger", "Tokens sent, reused, recomputed and..."),
    "list": ("reads", "list_", "List conversations, the latest activity..."),
    "mcp": ("mcpface", "mcp", "MCP server for agents (stdio by default)."),
    "memory": (
        "store",
        "memory",
        "The memory store (<home>/memory.json) that...",
    ),
    "models": ("models", "models", "Each configured backend's models: tools,..."),
    "new": ("conv", "new", "Start a conversation; prints its id (with..."),
    "plugins": (
        "plugins",
        "plugins",
        "The backends, NEED tools, context kinds...",
    ),
    "prune": ("index", "prune", "Delete archived conversations whose last..."),
    "reindex": ("index", "reindex", "Make the search index anew from the..."),
    "related": ("related", "related", "The conversations nearest in meaning to..."),
    "reopen": ("conv", "reopen", "Bring an archived conversation back to..."),
    "retract": (
        "recover",
        "retract",
        "Withdraw the last turn of CONVERSATION...",
    ),
    "respond": ("conv", "respond", "Answer a need the model is waiting for..."),
    "routes": (
        "routes",
        "routes",
        "The NEED routing rules, in the order they...",
    ),
    "run": ("daemon", "run", "Run the daemon in the foreground."),
    "search": ("index", "search", "Search the text of every conversation..."),
    "send": ("conv", "send", "Send TEXT (or - for stdin) to a..."),
    "service": (
        "service",
        "service_group",
        "Run the daemon as a user service (systemd...",
    ),
    "set-model": (
        "recover",
        "set_model",
        "Send the next turns of CONVERSATION to...",
    ),
    "state": ("store", "state", "The current-state store..."),
    "status": ("reads", "status", "A conversation's status; without one, the..."),
    "tail": ("reads", "tail", "Print a conversation's messages.log."),
    "templates": (
        "store",
        "templates",
        "The conversation templates: the home's...",
    ),
    "wait": ("conv", "wait", "Print the current exchange (from the..."),
    "watch": ("watch", "watch", "Print one line per finished reply or..."),
}


class _Group(click.Group):
    """Commands loaded on first use; every error is one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in COMMANDS:
            return found
        module, attr, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f"contemplation.faces.cli.{module}"), attr)
        assert isinstance(command, click.Command)
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            eager = super().get_command(ctx, name)
            text = eager.get_short_help_str(limit=45) if eager else COMMANDS[name][2]
            rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """The program: once the command returns or exits, its exit is bounded (see
        :mod:`contemplation.base.ending`), unless this group runs inside another program (a
        test's runner)."""
        from contemplation.base import ending

        if getattr(sys.modules.get("__main__"), "main", None) is self:  # the entry point's
            ending.enable()
        try:
            result = super().main(*args, **kwargs)
        except SystemExit as exc:
            ending.arm(_code(exc.code))
            raise
        except BaseException:
            ending.arm(1)
            raise
        ending.arm(0)
        return result

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            full = disk_full(exc)  # whatever wrote, and however the error came up
            if full is not None:
                fail(f"the disk is full: {_where(ctx, full)}")
            if isinstance(exc, ContemplationError):
                fail(str(exc))
            if isinstance(exc, OSError):
                fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
            raise


def _code(code: object) -> int:
    """The process's exit code for ``sys.exit(code)``."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _where(ctx: click.Context, exc: BaseException) -> str:
    """The file a full disk refused, else the home the command was writing in."""
    if isinstance(exc, OSError) and exc.filename:
        return str(exc.filename)
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    home = getattr(obj.get("light"), "home", None) or obj.get("home")  # see common.ctx_light
    return str(home) if home else "the conversation home"


@click.group(cls=_Group, epilog=EXIT_CODES)
@click.version_option(__version__, prog_name=PROG)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    help="Conversation home (default: CONTEMPLATION_HOME or the platform data dir).",
)
@click.option("--config", type=click.Path(path_type=Path), help="TOML settings file.")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "json"]),
    help="Diagnostic log format (stderr).",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (stderr).")
@click.pass_context
def main(
    ctx: click.Context,
    home: Path | None,
    config: Path | None,
    log_format: str | None,
    verbose: bool,
) -> None:
    """contemplation: a folder that is an asynchronous conversation queue with local LLMs."""
    private_umask()  # every command (run, mcp, the dashboard too) makes owner-only files
    overrides: dict[str, Any] = {}
    if log_format:
        overrides["log_format"] = log_format
    if verbose:
        overrides["log_level"] = "debug"
    ctx.ensure_object(dict).update(home=home, config=config, overrides=overrides)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL: commands, options, conversation ids (active
    and completed) and template names.

    \b
    bash:  eval "$(contemplation completion bash)"      (in ~/.bashrc)
    zsh:   eval "$(contemplation completion zsh)"       (in ~/.zshrc)
    fish:  contemplation completion fish > ~/.config/fish/completions/contemplation.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - click knows the three
        fail(f"no completion for {shell}")
    click.echo(cls(main, {}, PROG, f"_{PROG.upper()}_COMPLETE").source())
