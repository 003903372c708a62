"""The Claude Code plugin (package data in ``contemplation/faces/claude_code``: the MCP server, a
skill and an opt-in reminder hook), checked by the real ``claude`` of Claude Code 2.1.328: the
shipped folder passes ``claude plugin validate``, and ``contemplation install claude-code``
installs it in one step (a local marketplace and ``claude plugin install``) so that
``claude mcp list`` finds the server connected."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests import peers
from tests.conftest import ROOT
from tests.system.test_mcp_server import TOOLS

PLUGIN = ROOT / "contemplation" / "faces" / "claude_code"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir(exist_ok=True)
    return {
        "HOME": str(tmp_path / "home"),
        "PATH": "/usr/bin:/bin",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def _claude(tmp_path: Path, *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(peers.node_bin("claude")), *args],
        env=_env(tmp_path),
        cwd=cwd or tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _install(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "contemplation", "--home", str(tmp_path / "conversations")),
            *("install", "claude-code", "--dir", str(tmp_path / "plugins")),
            *("--claude", str(peers.node_bin("claude")), *extra),
        ],
        env=_env(tmp_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_shipped_plugin_passes_the_real_claude_plugin_validate(tmp_path: Path) -> None:
    out = _claude(tmp_path, "plugin", "validate", str(PLUGIN))
    assert "✔ Validation passed" in out
    assert 'mcpServers: contemplation stdio contemplation ["mcp"]' in out
    assert "skills: contemplation:local-model-dialogue" in out
    assert "hooks:" not in out  # the reminder is opt-in
    assert "problem" not in out  # nothing the plugin directory would refuse


def test_install_claude_code_is_one_step_and_the_real_claude_finds_the_server(
    tmp_path: Path,
) -> None:
    done = _install(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Successfully installed plugin: contemplation@contemplation-local" in done.stdout
    plugin = tmp_path / "plugins" / "contemplation"
    out = _claude(tmp_path, "plugin", "validate", str(plugin))
    assert "✔ Validation passed" in out and "hooks:" not in out
    home = str(tmp_path / "conversations")
    assert (
        f'mcpServers: contemplation stdio {sys.executable} ["-P","-m","contemplation","--home",'
        f'"{home}","mcp"]'
    ) in out
    assert "✔ Validation passed" in _claude(tmp_path, "plugin", "validate", str(plugin.parent))
    listed = _claude(tmp_path, "plugin", "list")
    assert "contemplation@contemplation-local" in listed and "✔ enabled" in listed
    (tmp_path / "project").mkdir()
    health = _claude(tmp_path, "mcp", "list", cwd=tmp_path / "project")
    assert re.search(r"plugin:contemplation:contemplation: .* - ✔ Connected", health), health
    again = _install(tmp_path)  # running it again is safe
    assert again.returncode == 0 and "already installed" in again.stdout, again.stdout


def test_the_reminder_hook_is_installed_only_when_asked(tmp_path: Path) -> None:
    done = _install(tmp_path, "--with-hook")
    assert done.returncode == 0, done.stdout + done.stderr
    plugin = tmp_path / "plugins" / "contemplation"
    out = _claude(tmp_path, "plugin", "validate", str(plugin))
    assert "✔ Validation passed" in out and "hooks: SessionStart" in out
    reminder = subprocess.run(
        ["sh", "-c", json.loads((plugin / "hooks" / "hooks.json").read_text())["hooks"][
            "SessionStart"][0]["hooks"][0]["command"]],
        env={"CLAUDE_PLUGIN_ROOT": str(plugin), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    said = json.loads(reminder.stdout)["hookSpecificOutput"]
    assert said["hookEventName"] == "SessionStart"
    assert "conversation_start" in said["additionalContext"]
    assert _install(tmp_path).returncode == 0  # and taken away when installed without it
    assert not (plugin / "hooks").exists()


def test_the_skill_names_only_tools_the_server_has() -> None:
    skill = (PLUGIN / "skills" / "local-model-dialogue" / "SKILL.md").read_text()
    named = set(re.findall(r"`(conversation_[a-z_]+)`", skill))
    assert named and named <= TOOLS, named - TOOLS


def test_the_monitor_and_the_opt_in_rewake_hook_pass_the_real_validate(tmp_path: Path) -> None:
    """The plugin ships a monitor (``monitors/monitors.json``: ``watch --agent``,
    each line of which reaches Claude) and, with ``--with-rewake``, a Stop hook with
    ``asyncRewake`` (``watch --rewake``), both run with this installation's Python."""
    shipped = _claude(tmp_path, "plugin", "validate", str(PLUGIN))
    assert 'monitors: contemplation-replies "contemplation watch --agent"' in shipped
    done = _install(tmp_path, "--with-rewake")
    assert done.returncode == 0, done.stdout + done.stderr
    plugin = tmp_path / "plugins" / "contemplation"
    out = _claude(tmp_path, "plugin", "validate", str(plugin))
    assert "✔ Validation passed" in out and "hooks: Stop" in out and "SessionStart" not in out
    base = [sys.executable, "-P", "-m", "contemplation", "--home", str(tmp_path / "conversations")]
    [monitor] = json.loads((plugin / "monitors" / "monitors.json").read_text())
    assert monitor["command"] == shlex.join([*base, "watch", "--agent"])
    assert f"monitors: contemplation-replies {json.dumps(monitor['command'])}" in out
    [stop] = json.loads((plugin / "hooks" / "hooks.json").read_text())["hooks"]["Stop"]
    assert stop["hooks"] == [
        {"type": "command", "command": shlex.join([*base, "watch", "--rewake"]), "asyncRewake": True}
    ]
    idle = subprocess.run(  # the hook's command as Claude Code runs it: nothing awaited, exit 0
        ["sh", "-c", stop["hooks"][0]["command"]], capture_output=True, text=True, timeout=60
    )
    assert idle.returncode == 0 and idle.stdout == "", idle.stderr
