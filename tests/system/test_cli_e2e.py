"""The CLI as a user runs it: real processes (the daemon, the CLI, bash) against the scripted
Ollama-wire fake on loopback. Exit codes, what goes to stdout and what to stderr, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.faces.reading import Reader
from contemplation.models import BlockKind, Status
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, read_state
from tests.conftest import ROOT, DaemonProc, base_env, cli, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

VENV_BIN = Path(sys.executable).parent


class Lines:
    """A process's stream read line by line on a thread (bounded), so a test can wait for a
    line while the process runs."""

    MAX = 10_000

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            if len(self.lines) < self.MAX:
                self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def popen(
    procs: list[subprocess.Popen[str]], env: dict[str, str], *args: str
) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-m", "contemplation", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    procs.append(p)
    return p


def model_texts(conv: Conv) -> list[str]:
    try:
        data = conv.log.read_bytes()
    except FileNotFoundError:
        return []
    return [b.text for b in parse(data).blocks if b.kind is BlockKind.MODEL and not b.interrupted]


# --------------------------------------------------------------------------- send --wait


def test_send_wait_stops_at_a_need_no_rule_answers_with_exit_3_and_the_command(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli(env, "new", "release").stdout.strip()
    fake_ollama.enqueue(
        Step(text="I need two things.\nNEED: The release manager\nNEED: The ship date"),
        Step(text="Ada ships on Friday."),
    )
    waited = cli(env, "send", conv_id, "Who ships it?", "--wait", "--timeout", "30", check=False)
    assert waited.returncode == 3, waited.stderr
    assert "NEED: The release manager" in waited.stdout  # the reply streamed to stdout
    manager, date = Reader(home).waiting(Conv(home.active / conv_id))
    assert f"need {manager.id}: The release manager" in waited.stderr
    assert f"need {date.id}: The ship date" in waited.stderr
    command = f'contemplation respond {conv_id} "…" --need {date.id}'
    assert command in waited.stderr
    # the printed command works as printed, with the answer filled in
    args = shlex.split(command.replace("…", "on Friday"))[1:]
    assert f"answered need {date.id}: The ship date" in cli(env, *args).stdout
    # the other need kept its id: the command printed for it still works
    last = cli(env, "respond", conv_id, "Ada", "--need", manager.id)
    assert f"answered need {manager.id}: The release manager" in last.stdout
    wait_for(lambda: model_texts(Conv(home.active / conv_id))[-1:] == ["Ada ships on Friday."])


def test_send_wait_without_a_daemon_times_out_with_exit_4_and_says_why(home: Home) -> None:
    env = base_env(home)
    conv_id = cli(env, "new", "lonely").stdout.strip()
    t0 = time.monotonic()
    r = cli(env, "send", conv_id, "anyone?", "--wait", "--timeout", "0.5", check=False)
    assert r.returncode == 4
    assert time.monotonic() - t0 < 20
    assert "note: no daemon is running" in r.stderr
    assert f"timed out after 0.5 s; {conv_id} is pending: stalled: no daemon is running" in r.stderr
    assert len(list(Conv(home.active / conv_id).inbox.iterdir())) == 1  # still queued


def test_send_wait_timeout_says_the_turn_is_generating(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli(env, "new", "slow").stdout.strip()
    fake_ollama.enqueue(
        Step(kind="hang", after_chunks=1, text="thinking about it", hang_seconds=30)
    )
    r = cli(env, "send", conv_id, "go", "--wait", "--timeout", "5", check=False)
    assert r.returncode == 4, r.stderr
    # the words of status, MCP and the dashboard: the first chunk came
    assert re.search(rf"{conv_id} is generating: generating for \d+ s: ~\d+ tokens so far", r.stderr)
    assert "contemplation tail -f" in r.stderr
    cli(env, "cancel", conv_id)


def test_send_wait_reports_a_failed_turn_with_exit_1(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli(env, "new", "broken").stdout.strip()
    fake_ollama.enqueue(Step(kind="error", status=400, error="invalid options"))
    r = cli(env, "send", conv_id, "go", "--wait", "--timeout", "30", check=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "invalid options" in r.stderr and "Traceback" not in r.stderr
    st = read_state(Conv(home.active / conv_id))
    assert st is not None and st.status is Status.ERROR


def test_send_wait_returns_0_when_the_reply_is_done(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli(env, "new", "fine").stdout.strip()
    fake_ollama.enqueue(Step(text="all good here", chunk_delay=0.01))
    r = cli(env, "send", conv_id, "how are you?", "--wait", "--timeout", "30", check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("all good here")


# --------------------------------------------------------------------------- tail --json -f


def test_tail_json_follow_prints_each_block_once_it_is_whole(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    procs: list[subprocess.Popen[str]],
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli(env, "new", "follow").stdout.strip()
    tail = popen(procs, env, "tail", conv_id, "--json", "-f")
    out = Lines(tail.stdout)
    fake_ollama.enqueue(Step(text="one two three four five six", chunk_delay=0.05))
    cli(env, "send", conv_id, "count")
    wait_for(lambda: len(out.lines) >= 2, timeout=20, what="two blocks")
    blocks = [json.loads(line) for line in out.lines]
    assert [b["kind"] for b in blocks] == ["agent", "model"]
    assert blocks[1]["text"].strip() == "one two three four five six"  # whole, not a piece


# --------------------------------------------------------------------------- Ctrl-C on run


def test_ctrl_c_with_a_turn_in_flight_says_the_grace_and_a_second_stops_at_once(
    home: Home, fake_ollama: FakeOllama, procs: list[subprocess.Popen[str]]
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_STOP_GRACE="30")
    daemon = popen(procs, env, "run")
    err = Lines(daemon.stderr)
    wait_for(home.daemon_info.exists, timeout=15, what="daemon start")
    fake_ollama.enqueue(Step(text=" ".join(f"w{i}" for i in range(2000)), chunk_delay=0.02))
    conv_id = cli(env, "new", "long", "--message", "write a lot").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: b"w5 " in conv.log.read_bytes(), what="streaming started")
    daemon.send_signal(signal.SIGINT)
    wait_for(
        lambda: err.has("finishing the turn (30 s); Ctrl-C again to stop now"),
        what="the grace message",
    )
    assert daemon.poll() is None  # it is finishing the turn, not gone
    t0 = time.monotonic()
    daemon.send_signal(signal.SIGINT)
    assert daemon.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 5  # not the 30 s grace
    assert err.has("stopping now")
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].kind is BlockKind.MODEL and blocks[-1].interrupted


def test_ctrl_c_when_idle_stops_without_the_grace_message(
    home: Home, fake_ollama: FakeOllama, procs: list[subprocess.Popen[str]]
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_STOP_GRACE="30")
    daemon = popen(procs, env, "run")
    wait_for(home.daemon_info.exists, timeout=15, what="daemon start")
    daemon.send_signal(signal.SIGINT)
    assert daemon.wait(timeout=10) == 0
    assert "finishing" not in (daemon.stderr.read() if daemon.stderr else "")


# --------------------------------------------------------------------------- routes


def test_routes_test_call_logs_only_with_verbose(home: Home, tmp_path: Path) -> None:
    (tmp_path / "plan.md").write_text("ship it\n")
    config = tmp_path / "config.toml"
    config.write_text(f"[tools]\nallowed_roots = [{json.dumps(str(tmp_path))}]\n")
    env = base_env(home, CONTEMPLATION_CONFIG=str(config))
    need = f"File contents of {tmp_path / 'plan.md'}"
    quiet = cli(env, "routes", "test", "--call", need)
    assert quiet.stdout.startswith("RESPONSE TO NEED:") and "ship it" in quiet.stdout
    assert "need answered" not in quiet.stderr and "need_answered" not in quiet.stdout
    loud = cli(env, "-v", "routes", "test", "--call", need)
    assert "need answered" in loud.stderr and "need_answered" not in loud.stdout


# --------------------------------------------------------------------------- completion


def test_the_installed_command_completes_ids_for_the_shell(home: Home) -> None:
    env = base_env(home)
    conv_id = cli(env, "new", "complete me").stdout.strip()
    exe = VENV_BIN / "contemplation"
    if not exe.exists():
        pytest.skip("the console script is not installed in this environment")
    words = "contemplation status conv_"
    r = subprocess.run(
        [str(exe)],
        env={
            **env,
            "_CONTEMPLATION_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"plain,{conv_id}"]


def test_the_bash_script_registers_the_completion_in_a_real_bash(home: Home) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    env = {**base_env(home), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run(
        [
            bash,
            "--norc",
            "-c",
            'eval "$(contemplation completion bash)" && complete -p contemplation',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert "contemplation" in r.stdout and "-F" in r.stdout
