"""Wake the agent where tasks do not reach (issue 44): ``contemplation watch --agent`` prints
one line per finished reply or lookup waiting, for the conversations the agent started (MCP's
conversation_start, or the CLI in Claude Code's Bash tool, which sets ``CLAUDECODE=1``), says
what to call next, and keeps watching while no daemon runs. A real daemon process against
the scripted fake Ollama, the real CLI; the watcher is a real process read line by line."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
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


def test_the_agents_watch_stops_when_the_session_that_started_it_is_gone(
    home: Home, tmp_path: Path
) -> None:
    """A monitor outliving its session would poll the home forever. Claude Code runs its
    monitor as ``bash -c '…; watch --agent'`` with a socket for stdout, in a session of its
    own, so the shell outlives a SIGKILLed Claude Code and the watch's parent never changes.
    A stand-in session does the same and is killed: the watch sees its stdout's reader gone
    and exits within seconds; a person's ``watch`` on a terminal-less /dev/null keeps going."""
    pids = tmp_path / "pids"
    env = {"CONTEMPLATION_HOME": str(home.root), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    watch = f"{sys.executable} -m contemplation watch --interval 0.2"
    spawn = (
        "import socket, subprocess, time\n"
        "ours, theirs = socket.socketpair()\n"
        f"a = subprocess.Popen(['bash', '-c', 'true; {watch} --agent; true'], stdout=theirs,"
        " start_new_session=True)\n"
        f"p = subprocess.Popen({watch!r}.split(), stdout=subprocess.DEVNULL)\n"
        f"open({str(pids)!r}, 'w').write(f'{{a.pid}} {{p.pid}}')\n"
        "time.sleep(3600)\n"
    )
    session = procgroups.popen([sys.executable, "-c", spawn], env=env, cwd=ROOT)
    agent = 0
    try:
        wait_for(lambda: pids.exists() and " " in pids.read_text(), 30, what="the watches")
        shell, person = (int(p) for p in pids.read_text().split())
        wait_for(lambda: _child(shell), 30, what="the shell's watch")
        agent = _child(shell)
        # in its loop (sleeping between looks), past the start that notes its parent
        wchan = Path(f"/proc/{agent}/wchan")
        wait_for(lambda: "nanosleep" in wchan.read_text(), 30, what="the agent's watch looking")
        session.kill()  # SIGKILL: its socket's end closes, as Claude Code's would
        session.wait(10)
        wait_for(lambda: _gone(agent), 10, what="the agent's watch to stop")
        assert not _gone(person)  # a person's watch is theirs to stop
    finally:
        procgroups.kill(session)
        for pid in [agent, *((int(p) for p in pids.read_text().split()) if pids.exists() else ())]:
            with contextlib.suppress(ProcessLookupError):
                if pid:
                    os.kill(pid, signal.SIGKILL)


def _child(pid: int) -> int:
    """A child of ``pid`` (0: none yet)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(kids[0]) if kids else 0


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True
