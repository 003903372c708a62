"""The real Claude Code (2.1.328, from npm) hands a dialogue to a local model and is *told*
the reply: no ``conversation_wait`` or ``conversation_check`` call.

Claude Code runs interactively on a pseudo-terminal (its ``-p`` mode keeps MCP tasks off: the
tasks switch defaults on for the ``cli`` entrypoint only, and a non-interactive session
refuses tasks it cannot move to the background), offline: "Claude" is a scripted Anthropic
Messages server (:mod:`tests.fakes.anthropic_server`), the local model a scripted Ollama
behind the real daemon, and ``contemplation mcp`` the stdio MCP server Claude Code starts.
With ``CLAUDE_CODE_DISABLE_MCP_TASKS=1`` the same scenario goes through the old contract."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contemplation.store.layout import Home
from tests import peers, procgroups
from tests.conftest import DaemonProc, base_env, wait_for
from tests.fakes.anthropic_server import FakeAnthropic, Turn
from tests.fakes.ollama_server import FakeOllama, Step

REPLY = "Add an index on users(email)."
START = "mcp__contemplation__conversation_start"
WAIT = "mcp__contemplation__conversation_wait"
SCREEN_KEPT = 64 * 1024  # bytes of Claude Code's screen kept for a failure message


class Terminal:
    """A process on a pseudo-terminal whose screen is drained (and its tail kept)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        master, slave = pty.openpty()
        self.proc = procgroups.popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd
        )
        os.close(slave)
        self.master = master
        self.screen = bytearray()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.screen += data
            del self.screen[:-SCREEN_KEPT]

    def tail(self) -> str:
        return bytes(self.screen[-4000:]).decode("utf-8", "replace")

    def stop(self) -> None:
        procgroups.kill(self.proc)
        os.close(self.master)


def claude_env(home: Home, tmp: Path, anthropic: FakeAnthropic, fake: FakeOllama) -> dict[str, str]:
    env = base_env(home, fake, CONTEMPLATION_DASHBOARD_ENABLED="false")
    env.update(
        HOME=str(tmp / "claude-home"),  # Claude Code's own config stays here
        ANTHROPIC_BASE_URL=anthropic.url,
        ANTHROPIC_API_KEY="any",
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        ENABLE_TOOL_SEARCH="false",  # MCP tools listed in the request
        TERM="xterm-256color",
    )
    return env


def set_up_claude(env: dict[str, str], project: Path) -> None:
    """``claude mcp add`` as a person would, and the first-run questions answered in its
    config (onboarding, the API key from the environment, trust of the project folder)."""
    claude = peers.node_bin("claude")
    Path(env["HOME"]).mkdir(parents=True)
    project.mkdir()
    subprocess.run(
        [
            str(claude),
            "mcp",
            "add",
            "contemplation",
            "--",
            sys.executable,
            "-m",
            "contemplation",
            "mcp",
        ],
        env=env,
        cwd=project,
        check=True,
        capture_output=True,
        timeout=60,
    )
    config_path = Path(env["HOME"]) / ".claude.json"
    config = json.loads(config_path.read_text())
    config.update(
        hasCompletedOnboarding=True,
        theme="dark",
        customApiKeyResponses={"approved": [env["ANTHROPIC_API_KEY"][-20:]], "rejected": []},
    )
    config["projects"][str(project)]["hasTrustDialogAccepted"] = True
    config_path.write_text(json.dumps(config))


@pytest.fixture
def anthropic() -> Iterator[Callable[..., FakeAnthropic]]:
    made: list[FakeAnthropic] = []

    def make(*turns: Turn) -> FakeAnthropic:
        made.append(FakeAnthropic(*turns).start())
        return made[-1]

    yield make
    for fake in made:
        fake.stop()


def run_claude(env: dict[str, str], project: Path, fake: FakeAnthropic, *tools: str) -> None:
    """Claude Code with one prompt, until "Claude" has been handed the local model's reply."""
    claude = peers.node_bin("claude")
    argv = [str(claude), "Ask the local model about indexes.", "--allowedTools", ",".join(tools)]
    term = Terminal(argv, env, project)
    try:

        def handed() -> bool:
            if term.proc.poll() is not None:
                raise AssertionError(f"claude exited: {term.tail()}")
            with fake.lock:
                return any(REPLY in json.dumps(r) for r in fake.requests)

        wait_for(handed, 90, what=f"the reply handed to Claude; screen: {term.tail()[-1500:]}")
    finally:
        term.stop()


def test_claude_code_is_told_the_reply_through_a_task_without_waiting_or_checking(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],
) -> None:
    fake = anthropic(Turn(tool=START, input={"topic": "Indexes", "initial_prompt": "Which index?"}))
    env = claude_env(home, tmp_path, fake, fake_ollama)
    set_up_claude(env, tmp_path / "project")
    fake_ollama.enqueue(Step(text=REPLY))
    daemon_factory(env, home).wait_ready()
    run_claude(env, tmp_path / "project", fake, START)
    # "Claude" called one tool, was answered with a task at once, and the reply came to it
    # later as the task's result: no conversation_wait, no conversation_check
    assert fake.tool_uses() == [START]
    [started] = fake.tool_results()
    assert "server-side task conv_" in json.dumps(started)
    with fake.lock:
        told = json.dumps(fake.requests[-1]["messages"][-1])
    assert "<status>completed</status>" in told and REPLY in told


def test_with_tasks_disabled_claude_code_goes_through_the_old_contract(
    home: Home,
    tmp_path: Path,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    anthropic: Callable[..., FakeAnthropic],
) -> None:
    def wait_for_it(started: str) -> dict[str, Any]:
        assert started.startswith("{"), repr(started[:500])
        out = json.loads(started)
        return {"conversation_id": out["conversation_id"], "cursor": out["cursor"], "timeout_s": 45}

    fake = anthropic(
        Turn(tool=START, input={"topic": "Indexes", "initial_prompt": "Which index?"}),
        Turn(tool=WAIT, then=wait_for_it),
    )
    env = claude_env(home, tmp_path, fake, fake_ollama) | {"CLAUDE_CODE_DISABLE_MCP_TASKS": "1"}
    set_up_claude(env, tmp_path / "project")
    fake_ollama.enqueue(Step(text=REPLY))
    daemon_factory(env, home).wait_ready()
    run_claude(env, tmp_path / "project", fake, START, WAIT)
    assert fake.tool_uses() == [START, WAIT]
    started, waited = fake.tool_results()
    assert json.loads(started["content"][0]["text"])["created"] is True  # today's result
    assert REPLY in waited["content"][0]["text"]
