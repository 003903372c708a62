"""The Claude Code plugin (``integrations/claude-code``: the MCP server and a skill), checked
by the real ``claude plugin validate`` of Claude Code 2.1.328."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests import peers
from tests.conftest import ROOT
from tests.system.test_mcp_server import TOOLS

PLUGIN = ROOT / "integrations" / "claude-code"


def test_the_plugin_passes_the_real_claude_plugin_validate(tmp_path: Path) -> None:
    claude = peers.node_bin("claude")
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        [str(claude), "plugin", "validate", str(PLUGIN)],
        env={
            "HOME": str(tmp_path / "home"),
            "PATH": "/usr/bin:/bin",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "✔ Validation passed" in done.stdout
    assert 'mcpServers: contemplation stdio contemplation ["mcp"]' in done.stdout
    assert "skills: contemplation:local-model-dialogue" in done.stdout
    assert "problem" not in done.stdout  # nothing the plugin directory would refuse


def test_the_skill_names_only_tools_the_server_has() -> None:
    skill = (PLUGIN / "skills" / "local-model-dialogue" / "SKILL.md").read_text()
    named = set(re.findall(r"`(conversation_[a-z_]+)`", skill))
    assert named and named <= TOOLS, named - TOOLS
