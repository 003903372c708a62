"""Wake the agent where tasks do not reach (issue 44): ``contemplation watch --agent`` prints
one line per finished reply or lookup waiting, for the conversations the agent started (MCP's
conversation_start, or the CLI in Claude Code's Bash tool, which sets ``CLAUDECODE=1``), says
what to call next, and keeps watching while no daemon runs. A real daemon process against
the scripted fake Ollama, the real CLI; the watcher is a real process read line by line."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.models import Status
from contemplation.store.layout import Home, read_metadata
from tests import procgroups
from tests.conftest import ROOT, DaemonProc, cli, wait_for
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_permissions import daemon_env, state_is


class Watcher:
    """``contemplation watch ARGS`` as a process, its stdout lines in a queue."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = procgroups.popen(
            [sys.executable, "-m", "contemplation", "watch", "--interval", "0.2", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next(self, seconds: float = 30) -> str:
        try:
            return self.lines.get(timeout=seconds)
        except queue.Empty:
            err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
            raise AssertionError(f"no line from watch in {seconds} s {err}") from None

    def nothing_more(self) -> None:
        assert self.lines.empty(), self.lines.get()


@pytest.fixture
def watchers() -> Iterator[Callable[..., Watcher]]:
    made: list[Watcher] = []

    def start(env: dict[str, str], *args: str) -> Watcher:
        made.append(Watcher(env, *args))
        return made[-1]

    yield start
    for w in made:
        procgroups.kill(w.proc)


def test_watch_agent_says_each_reply_and_approval_of_the_agents_conversations(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    watchers: Callable[..., Watcher],
    tmp_path: Path,
) -> None:
    env, notes = daemon_env(home, fake_ollama, tmp_path, 'read_file = "ask"')
    (notes / "a.md").write_text("content of a")
    agent_env = env | {"CLAUDECODE": "1"}  # what Claude Code's Bash tool runs commands with
    watcher = watchers(env, "--agent")  # started before any daemon: it needs none
    mine = cli(agent_env, "new", "agent's", "--model", "gemma").stdout.strip()
    theirs = cli(env, "new", "person's", "--model", "gemma").stdout.strip()
    meta = read_metadata(home.conv(mine))
    assert meta is not None and (meta.model_extra or {}).get("started_by") == "claude-code"
    other = read_metadata(home.conv(theirs))
    assert other is not None and "started_by" not in (other.model_extra or {})

    daemon = daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="Theirs."))
    cli(env, "send", theirs, "hello")
    wait_for(lambda: b"Theirs." in home.conv(theirs).log.read_bytes(), 30, what="their reply")
    fake_ollama.enqueue(Step(text="Mine."))
    cli(agent_env, "send", mine, "hello")
    line = watcher.next()
    assert line == f"contemplation: {mine} (agent's) replied: read it: contemplation wait {mine}"

    daemon.stop()  # no daemon: the watcher goes on
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {notes / 'a.md'}"), Step(text="Ok."))
    cli(agent_env, "send", mine, "read a")
    daemon_factory(env, home).wait_ready()
    wait_for(state_is(home.conv(mine), Status.AWAITING_APPROVAL), 30, what="awaiting approval")
    asked = watcher.next()
    assert asked.startswith(f"contemplation: {mine} (agent's) waits for an approval: lookup ")
    assert f"the person decides: contemplation approve {mine} --need " in asked
    assert watcher.proc.poll() is None
    watcher.nothing_more()  # the person's conversation never said a word


def test_rewake_waits_for_the_agents_reply_and_exits_2(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    env, _ = daemon_env(home, fake_ollama, tmp_path, "")
    agent_env = env | {"CLAUDECODE": "1"}
    idle = cli(env, "watch", "--rewake", "--interval", "0.2", timeout=30)
    assert idle.returncode == 0 and idle.stdout == ""  # nothing awaited: nothing to wake for
    mine = cli(agent_env, "new", "agent's", "--model", "gemma", "--message", "hi").stdout.strip()
    hook = procgroups.popen(
        [sys.executable, "-m", "contemplation", "watch", "--rewake", "--interval", "0.2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        fake_ollama.enqueue(Step(text="Done."))
        daemon_factory(env, home).wait_ready()
        out, err = hook.communicate(timeout=60)
        assert out.strip() == err.strip()
    finally:
        procgroups.kill(hook)
    assert hook.returncode == 2
    assert err.strip() == f"contemplation: {mine} (agent's) replied: read it: contemplation wait {mine}"
