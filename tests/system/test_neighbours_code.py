"""No neighbour's code runs: every Python process of ours imports the
package, its dependencies and the standard library, never a module lying in the folder it was
started from.

A folder is planted with modules named like the standard library's, the package's dependencies
and the package itself (``contemplation/__main__.py``, an ``mcp/`` package as any MCP server
project has); each, when imported, leaves a mark in a folder of the test's. Then the processes
that start children of ours are started there: the schema checker's child, the plugin probes
(``plugins --probe``, ``doctor``), and the MCP server as the Claude Code plugin and the Claude
Desktop bundle start it. Each must do its work and leave no mark."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from contemplation.faces import claude
from contemplation.store.layout import Home
from tests.conftest import base_env
from tests.system.test_plugin_faults import install

# a stdlib module the children import, dependencies of the package, and the package itself
PLANTED = ("json", "signal", "typing", "pydantic", "jsonschema_rs", "click", "structlog", "anyio")
PACKAGES = ("mcp", "contemplation")


def plant(folder: Path, marks: Path) -> Path:
    """``folder`` with every planted module; each writes ``marks/<name>`` when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    marks.mkdir(parents=True, exist_ok=True)

    def source(name: str) -> str:
        return f"open({str(marks / name)!r}, 'w').write('imported')\n"

    for name in PLANTED:
        (folder / f"{name}.py").write_text(source(name))
    for name in PACKAGES:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(source(name))
        (folder / name / "__main__.py").write_text(source(f"{name}.__main__"))
    (folder / "mcp" / "server").mkdir()
    (folder / "mcp" / "server" / "__init__.py").write_text(source("mcp.server"))
    return folder


def marked(marks: Path) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    marks = tmp_path / "marks"
    return plant(tmp_path / "shared-folder", marks), marks


def test_the_schema_checkers_child_imports_nothing_from_the_working_folder(
    planted: tuple[Path, Path], home: Home
) -> None:
    """The daemon (itself started safely, as its console script is) in a folder another user
    can write: a reply held to a schema is checked by a child that must not import the
    folder's ``json.py`` (before: it ran, on every checked reply)."""
    folder, marks = planted
    script = (
        "import asyncio, json\n"
        "from contemplation.protocol.replycheck import checked\n"
        "schema = {'type': 'object', 'required': ['b']}\n"
        "print(json.dumps([asyncio.run(checked(t, schema)) for t in ('{\"a\": 1}', '{\"b\": 2}')]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", script],
        cwd=folder,
        env=base_env(home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    bad, good = json.loads(done.stdout.strip().splitlines()[-1])
    assert bad is not None and "b" in bad, bad
    assert good is None
    assert marked(marks) == []


@pytest.mark.parametrize("command", [["plugins", "--probe"], ["doctor"]])
def test_plugin_probes_import_nothing_from_the_working_folder(
    planted: tuple[Path, Path], home: Home, tmp_path: Path, command: list[str]
) -> None:
    """``plugins --probe`` and ``doctor`` load each plugin in a child first: started in the
    planted folder, the children load the plugin and nothing of the folder's."""
    folder, marks = planted
    site = install(
        tmp_path / "site",
        "contemplation-neighbourly",
        {"contemplation.tools": {"upper": "neighbourly:tool"}},
        neighbourly="def tool(made):\n    raise RuntimeError('loaded by the probe')\n",
    )
    env = base_env(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-P", "-m", "contemplation", *command],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout + done.stderr
    assert "neighbourly" in out or "upper" in out, out  # the plugin was probed and named
    assert marked(marks) == [], out


def _bundle_command(home: Home, tmp_path: Path) -> list[str]:
    bundle = claude.write_bundle(tmp_path / "c.mcpb", home=home.root)
    unpacked = tmp_path / "bundle"
    with zipfile.ZipFile(bundle) as z:
        z.extractall(unpacked)
    config = json.loads((unpacked / "manifest.json").read_text())["server"]["mcp_config"]
    args = [a.replace("${__dirname}", str(unpacked)) for a in config["args"]]
    return [config["command"], *args]


async def _tools(command: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(cwd))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        return [t.name for t in (await s.list_tools()).tools]


@pytest.mark.parametrize("face", ["claude-code-plugin", "desktop-bundle"])
def test_the_mcp_server_as_claude_starts_it_imports_nothing_from_the_project(
    planted: tuple[Path, Path], home: Home, tmp_path: Path, face: str
) -> None:
    """Claude Code starts a plugin's stdio server in the project it has open: a project with
    its own ``mcp/`` package or ``contemplation/__main__.py`` (before: ``No module named
    'mcp.server'``, or the project's code ran instead of the server) changes nothing."""
    folder, marks = planted
    if face == "claude-code-plugin":
        plugin = claude.write_plugin(tmp_path / "market", claude.server_command(home.root))
        spec = json.loads((plugin / ".mcp.json").read_text())["mcpServers"]["contemplation"]
        command = [spec["command"], *spec["args"]]
    else:
        command = _bundle_command(home, tmp_path)
    env = base_env(home, CONTEMPLATION_DASHBOARD_ENABLED="false")
    env.pop("PYTHONPATH", None)
    tools = asyncio.run(_tools(command, env, folder))
    assert "conversation_start" in tools, tools
    assert marked(marks) == []


def test_the_planted_folder_does_take_over_an_unsafe_start(
    planted: tuple[Path, Path], home: Home
) -> None:
    """The control: the same folder does take over ``python -m contemplation`` started there
    without safe-path mode, so the tests above can fail."""
    folder, marks = planted
    subprocess.run(
        [sys.executable, "-m", "contemplation", "--help"],
        cwd=folder,
        env=base_env(home),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert "contemplation.__main__" in marked(marks) or "contemplation" in marked(marks)


