"""Commands that start at once: the CLI's entry point loads no module a command
does not need. A heavy module named here and found loaded after importing the entry point (in
a fresh interpreter) fails the test, so a top-level import that drags one in is caught."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("aiohttp", "mcp", "uvicorn", "starlette", "contemplation.faces.dashboard", "xllamacpp")


def test_the_cli_entry_point_loads_no_heavy_module() -> None:
    probe = (
        "import sys, json, contemplation.faces.cli.root; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(HEAVY)!r} "
        f"or any(m == h or m.startswith(h + '.') for h in {list(HEAVY)!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_help_loads_no_command_and_says_what_each_command_says() -> None:
    """``--help`` reads the table in contemplation.faces.cli.root, not the commands' modules; the
    table's
    lines are what the commands themselves say."""
    import click

    from contemplation.faces.cli.root import COMMANDS, main

    probe = (
        "import sys, json, runpy; sys.argv = ['contemplation', '--help']\n"
        "try:\n    runpy.run_module('contemplation', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('pydantic', "
        "'contemplation.cli_', 'contemplation.settings')))), file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "Commands:" in out.stdout and "wait " in out.stdout
    assert json.loads(out.stderr.strip().splitlines()[-1]) == []
    ctx = click.Context(main)
    for name, (_, _, line) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.get_short_help_str(limit=45) == line, name


def test_commands_that_only_name_backends_load_no_kind_module() -> None:
    """``settings`` knows no backend kind, and a built-in kind's name is known without its
    module; the kind modules themselves (their settings models) load without aiohttp, which
    comes with the first request."""
    probe = (
        "import sys, json\n"
        "from contemplation import backends, settings\n"
        "s = settings.load(env={}, config=None)\n"
        "named = [backends.named(s, n) for n in ('ollama', 'openai', 'opencode', 'local')]\n"
        "kinds = sorted(m for m in sys.modules if m.startswith('contemplation.backends.'))\n"
        "backends.config(s, 'openai'); backends.make('ollama', s)\n"
        "print(json.dumps([named, kinds, 'aiohttp' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    named, kinds, aiohttp = json.loads(out.stdout)
    assert named == [True] * 4 and kinds == [] and aiohttp is False
