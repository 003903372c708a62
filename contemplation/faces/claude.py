"""Installing contemplation into Claude: the Claude Code plugin and the Claude Desktop bundle.

The plugin's files ship in the package (``faces/claude_code``, read through
:mod:`importlib.resources`). :func:`write_plugin` writes them into a local marketplace folder
(outside the home: Claude Code reads the plugin in place from there), with the MCP server's
command pointing at this installation's Python, and the reminder hook only when asked;
:func:`claude_install` is the ``claude`` command that installs it from that marketplace.
:func:`write_bundle` writes a Claude Desktop ``.mcpb`` (a zip with ``manifest.json`` at its root,
manifest version 0.3 of ``@anthropic-ai/mcpb``'s schema).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import zipfile
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from contemplation import __version__
from contemplation.base import child
from contemplation.errors import ContemplationError

NAME = "contemplation"
MARKETPLACE = "contemplation-local"
PLUGIN_DATA = resources.files("contemplation").joinpath("faces", "claude_code")
HOOK_DATA = "opt-in"  # the opt-in hooks' files in the package, written to hooks/ when asked
REMINDER, REWAKE = "hooks.json", "rewake.json"  # in opt-in/: the reminder, the Stop rewake
DESCRIPTION = (
    "Hand a dialogue to a local LLM (Ollama, llama.cpp, OpenAI-compatible) through a durable "
    "folder queue; Claude is told when the model has answered."
)


def default_dir(env: dict[str, str] | None = None) -> Path:
    """Where the marketplace goes by default: beside the default home, never in it."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".local/share")
    return Path(base) / "contemplation-claude"


def server_command(home: Path | None = None, config: Path | None = None) -> list[str]:
    """``contemplation mcp`` as this installation runs it (its Python in safe-path mode,
    absolute paths): Claude Code starts it in the project it has open, whose own ``mcp/`` or
    ``contemplation/`` must not be imported in place of ours (:mod:`contemplation.base.child`)."""
    cmd = child.python("-m", NAME)
    if home is not None:
        cmd += ["--home", str(home.expanduser().absolute())]
    if config is not None:
        cmd += ["--config", str(config.expanduser().absolute())]
    return [*cmd, "mcp"]


def _copy(src: Traversable, dest: Path, skip: frozenset[str] = frozenset()) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in skip or item.name == "__pycache__":
            continue
        if item.is_dir():
            _copy(item, dest / item.name)
        else:
            (dest / item.name).write_bytes(item.read_bytes())


def _json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _hooks(plugin: Path, base: list[str], *, with_hook: bool, with_rewake: bool) -> None:
    """``hooks/hooks.json`` of the opt-in hooks asked for: the reminder (SessionStart, with
    its reminder.json) and the Stop hook that runs ``watch --rewake`` (asyncRewake)."""
    data = PLUGIN_DATA.joinpath(HOOK_DATA)
    events: dict[str, Any] = {}
    if with_hook:
        _copy(data, plugin / "hooks", skip=frozenset({REMINDER, REWAKE}))
        events |= json.loads(data.joinpath(REMINDER).read_text())["hooks"]
    if with_rewake:
        stop = json.loads(data.joinpath(REWAKE).read_text())["hooks"]["Stop"]
        stop[0]["hooks"][0]["command"] = shlex.join([*base, "watch", "--rewake"])
        events["Stop"] = stop
    if events:
        _json(plugin / "hooks" / "hooks.json", {"hooks": events})


def write_plugin(
    dest: Path, command: list[str], *, with_hook: bool = False, with_rewake: bool = False
) -> Path:
    """The marketplace folder ``dest`` with the plugin in ``dest/contemplation`` (made anew, so
    a hook installed before goes when it is not asked for again); the monitor
    (``monitors/monitors.json``) runs ``watch --agent`` with the MCP server's Python and
    flags. Returns the plugin's folder."""
    plugin = dest / NAME
    manifest = plugin / ".claude-plugin" / "plugin.json"
    if plugin.exists():
        try:
            ours = json.loads(manifest.read_text()).get("name") == NAME
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise ContemplationError(
                f"{plugin} exists and is not this plugin: choose another --dir"
            )
        shutil.rmtree(plugin)
    _copy(PLUGIN_DATA, plugin, skip=frozenset({HOOK_DATA}))
    _json(
        plugin / ".mcp.json", {"mcpServers": {NAME: {"command": command[0], "args": command[1:]}}}
    )
    base = command[:-1]  # the server's command less its "mcp"
    monitors = json.loads(PLUGIN_DATA.joinpath("monitors", "monitors.json").read_text())
    monitors[0]["command"] = shlex.join([*base, "watch", "--agent"])
    (plugin / "monitors" / "monitors.json").write_text(json.dumps(monitors, indent=2) + "\n")
    _hooks(plugin, base, with_hook=with_hook, with_rewake=with_rewake)
    entry = {"name": NAME, "source": f"./{NAME}", "description": DESCRIPTION}
    _json(
        dest / ".claude-plugin" / "marketplace.json",
        {
            "name": MARKETPLACE,
            "owner": {"name": NAME},
            "metadata": {"description": "contemplation, from this machine's installation"},
            "plugins": [entry],
        },
    )
    return plugin


def claude_install(claude: str, dest: Path, scope: str = "user") -> list[str]:
    """The one ``claude`` command that adds the marketplace (once) and installs the plugin."""
    return [claude, "plugin", "install", NAME, "--marketplace", str(dest), "--scope", scope]


def bundle_manifest(home: Path | None = None, config: Path | None = None) -> dict[str, Any]:
    """The ``.mcpb`` manifest (schema 0.3): Desktop starts ``server/main.py`` with this
    installation's Python, which runs ``contemplation mcp``."""
    flags = server_command(home, config)[4:-1]
    platform = {"linux": "linux", "darwin": "darwin", "win32": "win32"}.get(sys.platform, "linux")
    return {
        "manifest_version": "0.3",
        "name": NAME,
        "display_name": "contemplation",
        "version": __version__,
        "description": DESCRIPTION,
        "long_description": (
            "Asynchronous, durable conversations with local models: start one with "
            "conversation_start, then read the reply with conversation_wait (at most 50 s a "
            "call). Needs the contemplation daemon (contemplation run, or contemplation "
            "service install)."
        ),
        "author": {"name": NAME},
        "license": "MIT",
        "keywords": ["local-llm", "ollama", "llama.cpp", "mcp"],
        "server": {
            "type": "python",
            "entry_point": "server/main.py",
            "mcp_config": {
                "command": sys.executable,
                "args": [child.SAFE_PATH, "${__dirname}/server/main.py", *flags],
            },
        },
        "compatibility": {
            "platforms": [platform],
            "runtimes": {"python": ">=3.11"},
        },
    }


ENTRY_POINT = '''"""contemplation's MCP server, as Claude Desktop starts it from this bundle."""

import sys

from contemplation.faces.cli.root import main

sys.argv = ["contemplation", *sys.argv[1:], "mcp"]
main()
'''


def write_bundle(path: Path, home: Path | None = None, config: Path | None = None) -> Path:
    """The ``.mcpb`` at ``path`` (written whole, then renamed in)."""
    path = path.expanduser().absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(bundle_manifest(home, config), indent=2) + "\n")
        z.writestr("server/main.py", ENTRY_POINT)
    os.replace(part, path)
    return path
