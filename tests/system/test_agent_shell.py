"""The agent's shell is the agent: a CLI run from an agent's shell tool (Claude Code's Bash
tool sets ``CLAUDECODE=1`` in its commands' environment; Gemini CLI ``GEMINI_CLI=1``) is
the agent, so its ``approve`` follows ``agent_approves`` exactly as the MCP
``conversation_approve`` does, and what it decides is recorded as the agent's. Lines the
agent reads never hand it a runnable decision; the person's own terminal keeps the command.

The CLI runs in-process (click's runner) where its words are tested, and as real processes
where the process tree is what is tested (a mark unset in the agent's shell)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from contemplation.faces.cli.root import main
from contemplation.faces.reading import Reader
from contemplation.store.layout import Conv, Home, read_metadata
from tests.conftest import ROOT, base_env
from tests.system.test_dashboard_actions import asking

CLAUDE = {"CLAUDECODE": "1"}


def invoke(home: Home, *args: str, **env: str) -> Result:
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("CONTEMPLATION_")}
    clean |= {
        "CONTEMPLATION_HOME": str(home.root),
        "XDG_CONFIG_HOME": str(home.root.parent / "xdg-config"),
        "CONTEMPLATION_LOG_LEVEL": "warning",
    }
    return CliRunner().invoke(main, list(args), env=clean | env, prog_name="contemplation")


def decided(conv: Conv) -> list[tuple[str, str, str]]:
    meta = read_metadata(conv)
    assert meta is not None
    return [(d.decision, d.face, d.agent) for d in meta.approvals()]


def test_claude_codes_shell_cannot_approve_and_is_told_where_the_person_decides(
    home: Home,
) -> None:
    """The finding: Claude ran `contemplation approve … --always` in its Bash tool and it
    was recorded as the person's. Under the default (Claude Code shows the person forms) and
    under ``never``, it is refused, naming no command to paste; nothing is decided."""
    conv = asking(home, other=None)
    for env in (CLAUDE, CLAUDE | {"CONTEMPLATION_AGENT_APPROVES": "never"}):
        r = invoke(home, "approve", conv.id, "--always", **env)
        assert r.exit_code == 1, r.output
        assert "are the person's to decide" in r.stderr, r.stderr
        assert "in their own terminal" in r.stderr
        assert "contemplation approve" not in r.stderr
    # what Claude Code's Bash tool leaves after `unset CLAUDECODE`: the mark agents share,
    # which names Claude Code (its forms), not "an agent" that shows none
    shared = invoke(home, "approve", conv.id, "--always", AI_AGENT="claude-code_2-1-328_agent")
    assert shared.exit_code == 1 and "are the person's to decide" in shared.stderr
    assert decided(conv) == []
    assert Reader(home).waiting(conv)  # still waits for the person


def test_what_the_agents_shell_decides_is_recorded_as_the_agents(home: Home) -> None:
    """Where the config lets the agent decide, the record (and every listing of it) says
    it was the agent, and which one; the person's own terminal is still the person."""
    conv = asking(home, other=None)
    ok = invoke(home, "approve", conv.id, "--once", **CLAUDE, CONTEMPLATION_AGENT_APPROVES="always")
    assert ok.exit_code == 0, ok.output
    assert decided(conv) == [("once", "agent-cli", "Claude Code")]
    listed = invoke(home, "approvals")
    assert "by the agent (the CLI under Claude Code) at " in listed.stdout, listed.stdout

    other = asking(home, "gemini's", other=None)  # an agent whose client shows no forms
    gem = invoke(home, "approve", other.id, "--reject", GEMINI_CLI="1")
    assert gem.exit_code == 0, gem.output
    assert decided(other) == [("reject", "agent-cli", "Gemini CLI")]
    never = asking(home, "never", other=None)
    refused = invoke(home, "approve", never.id, "--once", GEMINI_CLI="1",
                     CONTEMPLATION_AGENT_APPROVES="never")  # fmt: skip
    assert refused.exit_code == 1 and decided(never) == []

    mine = asking(home, "the person's", other=None)
    person = invoke(home, "approve", mine.id, "--always")
    assert person.exit_code == 0 and decided(mine) == [("always", "cli", "")]


def test_status_names_no_decision_command_to_the_agent_but_keeps_it_for_the_person(
    home: Home,
) -> None:
    conv = asking(home, other=None)
    agent = invoke(home, "status", conv.id, **CLAUDE)
    assert agent.exit_code == 0, agent.output
    assert "the person decides it: in the form their MCP client shows" in agent.stdout
    assert "contemplation approve" not in agent.stdout
    person = invoke(home, "status", conv.id)
    assert f"contemplation approve {conv.id} --need " in person.stdout
    said = invoke(home, "respond", conv.id, "here it is", **CLAUDE)
    assert said.exit_code == 1 and "contemplation approve" not in said.stderr, said.stderr
    assert "The person decides it: in the form" in said.stderr


def test_unsetting_the_mark_in_the_agents_shell_does_not_make_it_the_person(
    home: Home, tmp_path: Path
) -> None:
    """The process tree, not the environment alone. A stand-in for Claude Code (a program
    named ``claude``, as its binary is) runs the shell tool's ``bash -c`` with the mark; the
    shell unsets it (or runs ``env -u``) before the CLI. The shell's starting environment
    still has the mark, and where bash execs its last command in place the CLI's parent is
    ``claude`` itself: either way it is the agent, and refused."""
    conv = asking(home, other=None)
    claude = tmp_path / "claude"
    claude.symlink_to(sys.executable)
    env = base_env(home) | CLAUDE
    cmd = f"{sys.executable} -m contemplation approve {conv.id} --always"
    run_it = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
    for shell in (
        f"unset CLAUDECODE; {cmd}",
        f"env -u CLAUDECODE {cmd}",
        f"unset CLAUDECODE; {cmd}; exit $?",
    ):
        run = subprocess.run(
            [str(claude), "-c", run_it, "bash", "-c", shell], env=env, cwd=ROOT,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert run.returncode == 1, (shell, run.stdout, run.stderr)
        assert "are the person's to decide" in run.stderr
    assert decided(conv) == []
