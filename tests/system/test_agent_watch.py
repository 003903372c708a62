"""Wake the agent where tasks do not reach: ``contemplation watch --agent`` prints
one line per finished reply or lookup waiting, for the conversations the agent started (MCP's
conversation_start, or the CLI in Claude Code's Bash tool, which sets ``CLAUDECODE=1``), says
what to call next, and keeps watching while no daemon runs. A real daemon process against
the scripted fake Ollama, the real CLI; the watcher is a real process read line by line."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.faces import watching
from contemplation.models import Status
from contemplation.store.layout import Conv, Home, read_metadata
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from tests import procgroups
from tests.conftest import ROOT, DaemonProc, cli, cli_here, wait_for
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
    mine = cli_here(agent_env, "new", "agent's", "--model", "gemma").stdout.strip()
    theirs = cli_here(env, "new", "person's", "--model", "gemma").stdout.strip()
    meta = read_metadata(home.conv(mine))
    assert meta is not None and (meta.model_extra or {}).get("started_by") == "claude-code"
    other = read_metadata(home.conv(theirs))
    assert other is not None and "started_by" not in (other.model_extra or {})

    daemon = daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="Theirs."))
    cli_here(env, "send", theirs, "hello")
    wait_for(lambda: b"Theirs." in home.conv(theirs).log.read_bytes(), 30, what="their reply")
    fake_ollama.enqueue(Step(text="Mine."))
    cli_here(agent_env, "send", mine, "hello")
    line = watcher.next()
    assert line == f"contemplation: {mine} (agent's) replied: read it: contemplation wait {mine}"

    daemon.stop()  # no daemon: the watcher goes on
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {notes / 'a.md'}"), Step(text="Ok."))
    cli_here(agent_env, "send", mine, "read a")
    daemon_factory(env, home).wait_ready()
    wait_for(state_is(home.conv(mine), Status.AWAITING_APPROVAL), 30, what="awaiting approval")
    asked = watcher.next()
    assert asked.startswith(f"contemplation: {mine} (agent's) waits for the person's approval: ")
    # the agent reads it: where the person decides, never a command it could run itself
    assert asked.endswith("the person decides it: in the form their MCP client shows, on the "
                          "dashboard, or in their own terminal"), asked  # fmt: skip
    assert "contemplation approve" not in asked
    assert watcher.proc.poll() is None
    watcher.nothing_more()  # the person's conversation never said a word


def test_rewake_waits_for_the_agents_reply_and_exits_2(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    env, _ = daemon_env(home, fake_ollama, tmp_path, "")
    agent_env = env | {"CLAUDECODE": "1"}
    idle = cli(env, "watch", "--rewake", "--interval", "0.2", timeout=30)
    assert idle.returncode == 0 and idle.stdout == ""  # nothing awaited: nothing to wake for
    mine = cli_here(agent_env, "new", "agent's", "--model", "gemma", "--message", "hi").stdout.strip()
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


# --------------------------------------------------------------------------- one wake a reply


def _started(home: Home, topic: str, by: str | None, session: str | None) -> Conv:
    extra = {k: v for k, v in (("started_by", by), ("started_in", session)) if v}
    return new_conversation(
        home, topic, template=load_template(home, "default"), model="m", backend="ollama",
        extra=extra or None, durable=False,
    )  # fmt: skip


def _now(conv: Conv, status: Status, grow: str = "") -> None:
    with open_writer(conv, durable=False) as w:
        if grow:
            with conv.log.open("a", encoding="utf-8") as f:
                f.write(grow)
            w.state.log.size = conv.log.stat().st_size
        w.state.status = status
        w.save()


def test_the_agents_watch_tells_its_own_session_once_per_reply(home: Home) -> None:
    """One wake per reply. The watch of the agent process S1 says nothing of S2's
    conversations nor of a person's; of a conversation an MCP task follows it says nothing
    the task's notification carries (the reply), only a decision the person took on another
    face while the task's form was out (the task says nothing until its form is answered)."""
    cli_mine = _started(home, "mine", "claude-code", "S1")
    cli_theirs = _started(home, "another session's", "claude-code", "S2")
    person = _started(home, "the person's", None, None)
    tasked = _started(home, "tasked", "mcp", "S1")
    (tasked.dir / "tasks").mkdir()
    (tasked.dir / "tasks" / ("0" * 32 + ".json")).write_text("{}")
    untasked = _started(home, "untasked", "mcp", "S1")
    every = (cli_mine, cli_theirs, person, tasked, untasked)
    for conv in every:
        _now(conv, Status.GENERATING)
    watch = watching.Watch(home, session="S1")
    assert watch.poll() == []  # what is so already is not news
    for conv in every:
        _now(conv, Status.IDLE, "reply\n")
    said = watch.poll()
    assert sorted(said) == sorted(
        [
            f"contemplation: {cli_mine.id} (mine) replied: read it: contemplation wait "
            f"{cli_mine.id}",
            f"contemplation: {untasked.id} (untasked) replied: read it: "
            f'conversation_check(conversation_id="{untasked.id}")',
        ]
    )
    assert watch.poll() == []
    raw = json.loads(tasked.metadata.read_text())  # the person approves on the dashboard
    raw["approvals"] = [
        {"request": "abc123", "decision": "once", "need": "the plan", "tool": "files.read",
         "time": "2026-11-29 02:00:00", "face": "dashboard"}
    ]  # fmt: skip
    tasked.metadata.write_text(json.dumps(raw))
    (line,) = watch.poll()
    assert line == (
        f"contemplation: {tasked.id} (tasked): the person approved once lookup files.read (the "
        "plan) on the dashboard; its form is answered: read the reply: "
        f'conversation_wait(conversation_id="{tasked.id}")'
    )
    assert watch.poll() == []
    assert len(watching.Watch(home).poll()) == 0  # a watch of no session primes quietly


def test_the_agents_conversation_is_seen_behind_many_newer_ones(home: Home) -> None:
    """The watch looked at the newest 1,000 conversations only: with 1,500 newer ones the
    agent's reply was never announced."""
    mine = _started(home, "mine", "claude-code", None)
    _now(mine, Status.GENERATING)
    for i in range(1_500):
        _started(home, f"newer {i}", None, None)
    watch = watching.Watch(home)
    assert watch.poll() == []
    _now(mine, Status.IDLE, "reply\n")
    assert watch.poll() == [
        f"contemplation: {mine.id} (mine) replied: read it: contemplation wait {mine.id}"
    ]


def test_a_reply_whose_tasks_server_died_is_said_by_the_watch(home: Home) -> None:
    """A task outlives its server: killed mid-task, the MCP server tells its client nothing
    more, so the agent's watch says the reply as it does where no task follows."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = f"{gone.stdout.strip()}:1"
    conv = _started(home, "orphaned", "mcp", None)
    (conv.dir / "tasks").mkdir()
    (conv.dir / "tasks" / ("1" * 32 + ".json")).write_text(json.dumps({"server": dead}))
    _now(conv, Status.GENERATING)
    watch = watching.Watch(home)
    assert watch.poll() == []
    _now(conv, Status.IDLE, "reply\n")
    assert watch.poll() == [
        f"contemplation: {conv.id} (orphaned) replied: read it: "
        f'conversation_check(conversation_id="{conv.id}")'
    ]
