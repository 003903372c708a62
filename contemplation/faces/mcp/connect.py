"""How Claude Code is given the HTTP face's token: never on a command line.

``claude mcp add --header "Authorization: Bearer <token>"`` puts the token in the argv of the
shell, of ``claude`` and of whatever runs it, where any local user reads it from
``/proc/*/cmdline``, and leaves it in ``~/.claude.json``. Claude Code's
``headersHelper`` instead runs a command of ours at each connection and reads the headers
from its standard output: ``contemplation mcp --print-headers`` (this installation's Python
in safe-path mode, the home and config it was set up with), which reads the token file
(0600) and prints ``{"Authorization": "Bearer <token>"}``. The line the person pastes,
:func:`claude_line`, is ``claude mcp add-json`` with that command, so the token is in no
process's argv and in no file of Claude Code's.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from contemplation.base.secret_names import MCP_TOKEN
from contemplation.faces import bearer, claude
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.writer import ensure_home


def helper_command(settings: Settings) -> str:
    """The ``headersHelper`` Claude Code runs (through a shell) for the headers."""
    argv = claude.server_command(Path(settings.home), settings.config_file)
    return shlex.join([*argv, "--print-headers"])


def claude_line(url: str, settings: Settings) -> str:
    """The one line that adds the HTTP face to Claude Code (user scope: a helper declared in
    a project's ``.mcp.json`` waits for that folder's trust), the token left out of it."""
    config = {"type": "http", "url": url, "headersHelper": helper_command(settings)}
    return "claude mcp add-json --scope user contemplation " + shlex.quote(json.dumps(config))


def headers(token_file: Path) -> str:
    """What the helper prints: the headers as one JSON object (the token made if missing)."""
    return json.dumps({"Authorization": f"Bearer {bearer.ensure_token(token_file)}"})


def print_headers(settings: Settings) -> None:
    """``contemplation mcp --print-headers``, the helper itself (quick: no MCP SDK import)."""
    home = Home(settings.home)
    ensure_home(home)
    print(headers(home.root / MCP_TOKEN))
