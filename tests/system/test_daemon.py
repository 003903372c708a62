"""The real daemon process and the real CLI, end to end against the fake Ollama on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.models import MarkerKind, Status
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, read_state
from tests.conftest import (
    ROOT,
    DaemonProc,
    base_env,
    cli,
    cli_here,
    model_replies,
    only_conv,
    wait_for,
)
from tests.fakes.ollama_server import FakeOllama, Step

replies = model_replies


def test_drop_daemon_backend_log_state_archive(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    d = daemon_factory(env, home).wait_ready()
    conv_id = cli_here(
        env, "new", "Memory persistence", "--message", "How should we persist memory?"
    ).stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: replies(conv) == ["Echo: How should we persist memory?"], what="first reply")
    # a file written straight into the inbox by a naive writer, in two steps
    with open(conv.inbox / "naive.txt", "w") as f:
        f.write("part one, ")
        f.flush()
        time.sleep(0.05)
        f.write("part two")
    wait_for(lambda: len(replies(conv)) == 2, what="second reply")
    assert replies(conv)[1] == "Echo: part one, part two"
    # the reply is in the log as it streams; its commit (turns, status) is the state write after
    wait_for(lambda: (st := read_state(conv)) is not None and st.turns == 2, what="the commit")
    listed = json.loads(cli_here(env, "list", "--json").stdout)["conversations"]
    assert [r["id"] for r in listed] == [conv_id] and listed[0]["status"] == "idle"
    status = json.loads(cli_here(env, "status", conv_id[:20], "--json").stdout)
    assert status["turns"] == 2 and status["messages"] == 2
    fake_ollama.enqueue(Step(text="We are done.\n=== COMPLETE ==="))
    cli_here(env, "send", "Memory", "Wrap up please")
    wait_for(lambda: (home.completed / conv_id).is_dir(), what="archive on COMPLETE")
    assert cli_here(env, "tail", conv_id).stdout.rstrip().endswith("=== COMPLETE ===")
    assert d.stop() == 0


def test_send_wait_streams_the_reply_to_stdout(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    conv_id = cli_here(env, "new", "streaming").stdout.strip()
    fake_ollama.enqueue(Step(text="one two three four five", chunk_delay=0.02))
    out = cli_here(
        env, "send", conv_id, "-", "--wait", "--timeout", "20", input="count for me\n"
    ).stdout
    assert "=== CLAUDE -> OLLAMA" in out and "count for me" in out
    assert "one two three four five" in out


def test_a_second_daemon_on_the_same_home_refuses(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    second = cli(env, "run", check=False, timeout=20)
    assert second.returncode == 1
    assert "already running" in second.stderr and "Traceback" not in second.stderr
    once = cli(env, "run", "--once", check=False, timeout=20)
    assert once.returncode == 1 and "already running" in once.stderr


def test_sigterm_mid_stream_marks_the_reply_and_a_restart_redoes_it_once(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_STOP_GRACE="0.3")
    d = daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text=" ".join(f"w{i}" for i in range(300)), chunk_delay=0.05))
    conv_id = cli_here(env, "new", "long", "--message", "write a lot").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: b"w5 " in conv.log.read_bytes(), what="streaming started")
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 5
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].interrupted
    st = read_state(conv)
    assert st is not None and st.intent is None
    fake_ollama.enqueue(Step(text="short answer"))
    d2 = daemon_factory(env, home).wait_ready()
    wait_for(lambda: replies(conv) == ["short answer"], what="redone after restart")
    assert d2.stop() == 0
    assert len(fake_ollama.chat_requests()) == 2


def test_cancel_from_the_cli_stops_the_generation(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text=" ".join(["tok"] * 1000), chunk_delay=0.02))
    conv_id = cli_here(env, "new", "cancel me", "--message", "go").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: b"tok tok" in conv.log.read_bytes(), what="streaming")
    cli_here(env, "cancel", conv_id)
    wait_for(
        lambda: (read_state(conv) or object()).__dict__.get("status") == Status.CANCELLED,
        what="cancelled",
    )
    blocks = parse(conv.log.read_bytes()).blocks
    assert any(k is MarkerKind.CANCELLED for k, _ in blocks[-1].markers)
    size = conv.log.stat().st_size
    time.sleep(0.3)  # nothing more is written after a cancel
    assert conv.log.stat().st_size == size


@pytest.mark.parametrize("after_chunks", [0, 1])
def test_cancel_stops_a_turn_whose_server_went_silent(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    after_chunks: int,
) -> None:
    """No chunk arrives to check the flag between: the watcher's poke cancels the task."""
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(kind="hang", after_chunks=after_chunks, hang_seconds=120))
    conv_id = cli_here(env, "new", "silent", "--message", "go").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: fake_ollama.chat_arrived.is_set(), what="the request")
    wait_for(
        lambda: (read_state(conv) or object()).__dict__.get("status") == Status.GENERATING,
        what="generating",
    )
    t0 = time.monotonic()
    cli_here(env, "cancel", conv_id)
    wait_for(
        lambda: (read_state(conv) or object()).__dict__.get("status") == Status.CANCELLED,
        what="cancelled",
        timeout=5,
    )
    assert time.monotonic() - t0 < 5
    assert not (conv.dir / ".cancel").exists()


@pytest.mark.parametrize("after_chunks", [0, 2])
def test_after_a_cancel_the_model_is_told_its_reply_was_cancelled(
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
    after_chunks: int,
) -> None:
    """The next request (as the server receives it) holds the cancelled
    turn as an assistant turn marked cancelled, with its partial words when there were any,
    so the model is never asked the cancelled question again in silence and no two user
    turns follow each other."""
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(
        Step(kind="hang", text="Once upon a time", after_chunks=after_chunks, hang_seconds=120),
        Step(text="One line it is."),
    )
    conv_id = cli_here(env, "new", "essay", "--message", "Write a long essay.").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(lambda: fake_ollama.chat_arrived.is_set(), what="the request")
    if after_chunks:
        wait_for(lambda: b"upon" in conv.log.read_bytes(), what="the partial reply")
    cli_here(env, "cancel", conv_id)
    wait_for(
        lambda: (read_state(conv) or object()).__dict__.get("status") == Status.CANCELLED,
        what="cancelled",
    )
    done = cli_here(env, "send", conv_id, "Just one line then.", "--wait", "--timeout", "30")
    assert done.stdout.rstrip().endswith("One line it is.")
    messages = fake_ollama.chat_requests()[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == "Write a long essay."
    said = messages[2]["content"]
    assert said.endswith("(the agent cancelled this reply)")
    assert ("Once upon" in said) is bool(after_chunks)
    assert messages[3]["content"] == "Just one line then."


def test_cli_errors_are_one_line(home: Home) -> None:
    env = base_env(home)
    for args in (
        ["status", "nope"],
        ["send", "nope", "hi"],
        ["new", "x", "--backend", "nope"],
        ["tail", "nope"],
    ):
        proc = cli(env, *args, check=False)
        assert proc.returncode != 0, args
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    cli_here(env, "new", "alpha one")
    cli_here(env, "new", "alpha two")
    amb = cli_here(env, "status", "conv_", check=False)
    assert amb.returncode == 1 and "matches 2 conversations" in amb.stderr


def test_doctor_reports_ollama_and_the_model(home: Home, fake_ollama: FakeOllama) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_DEFAULT_MODEL="qwen3")
    ok = cli_here(env, "doctor", "--json")
    data = json.loads(ok.stdout)
    assert data["ok"] is True
    assert {c["check"] for c in data["checks"]} >= {"home", "ollama", "model"}
    bad = cli_here({**env, "CONTEMPLATION_DEFAULT_MODEL": "missing-model"}, "doctor", check=False)
    assert bad.returncode == 1 and "FAIL model" in bad.stdout


def test_run_once_processes_pending_and_exits(home: Home, fake_ollama: FakeOllama) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    cli_here(env, "new", "batch", "--message", "hello")
    proc = subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert replies(only_conv(home)) == ["Echo: hello"]


def test_run_once_exits_1_naming_a_conversation_it_could_not_do_and_keeps_its_message(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """``run --once`` from a timer or a script: a conversation whose step failed (here a
    metadata.json broken by an edit) is the exit code 1 and a last line naming it and why;
    the others are answered, its message waits in inbox/, and once the file is mended the
    next run answers it and exits 0."""
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    fine = home.conv(cli_here(env, "new", "fine", "--message", "hello").stdout.strip())
    broken = home.conv(cli_here(env, "new", "broken", "--message", "wait for me").stdout.strip())
    whole = broken.metadata.read_bytes()
    broken.metadata.write_bytes(b'{"topic": 42}')
    run = cli(env, "run", "--once", check=False, timeout=30)
    last = run.stderr.strip().splitlines()[-1]
    print(f"exit {run.returncode}; last line: {last}")
    assert run.returncode == 1, run.stderr
    assert last.startswith("run --once: 1 conversation not done (" + broken.id + ": "), last
    assert "metadata.json does not read" in last and "Traceback" not in run.stderr
    assert last.count(broken.id) == 1 and "InputRejected" not in last, last  # said for people
    assert replies(fine) == ["Echo: hello"]
    assert broken.metadata.read_bytes() == b'{"topic": 42}'
    assert [p.read_text() for p in broken.inbox.iterdir()] == ["wait for me"]
    broken.metadata.write_bytes(whole)
    again = cli(env, "run", "--once", check=False, timeout=30)
    assert again.returncode == 0, again.stderr
    assert "not done" not in again.stderr
    assert replies(broken) == ["Echo: wait for me"]


def test_run_once_exits_1_when_the_server_cannot_be_reached_and_0_once_it_answers(
    home: Home, fake_ollama: FakeOllama
) -> None:
    """A turn left to retry (nothing listens at the server's address) is not done: exit 1 and
    the last line says the conversation retries and why; with the server back at its address
    (a setting changed: retried at once) the next run answers it and exits 0."""
    from tests.realpeers import free_port

    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    conv = home.conv(cli_here(env, "new", "down", "--message", "hello").stdout.strip())
    nowhere = {**env, "OLLAMA_HOST": f"http://127.0.0.1:{free_port()}"}
    run = cli(nowhere, "run", "--once", check=False, timeout=30)
    last = run.stderr.strip().splitlines()[-1]
    print(f"exit {run.returncode}; last line: {last}")
    assert run.returncode == 1, run.stderr
    assert last.startswith(f"run --once: 1 conversation not done ({conv.id}: retrying: "), last
    assert "cannot reach" in last, last
    assert fake_ollama.chat_requests() == [] and replies(conv) == []
    again = cli(env, "run", "--once", check=False, timeout=30)
    assert again.returncode == 0, again.stderr
    assert replies(conv) == ["Echo: hello"]


def test_an_inbox_name_that_is_not_utf8_is_answered_once(
    home: Home, fake_ollama: FakeOllama
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    cli_here(env, "new", "bytes")
    conv = only_conv(home)
    with open(os.path.join(os.fsencode(conv.inbox), b"q\xff.txt"), "wb") as f:
        f.write(b"hello")
    for _ in range(3):  # the first run answers it; the later ones find nothing to redo
        assert "Traceback" not in cli(env, "run", "--once", timeout=30).stderr
    assert replies(conv) == ["Echo: hello"]
    assert len(fake_ollama.chat_requests()) == 1
    assert list(conv.inbox.iterdir()) == [] and list(conv.processing.iterdir()) == []


def test_run_once_waits_for_a_file_written_in_place_to_settle(
    home: Home, fake_ollama: FakeOllama
) -> None:
    # the default settle_seconds (1 s): a file written in place a moment ago is still settling
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="1")
    inbox = home.active / "by-hand" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "q.txt").write_text("hello\n")
    # still being written as run --once looks (its mtime ahead of the CLI's start-up time)
    ahead = time.time() + 1.0
    os.utime(inbox / "q.txt", (ahead, ahead))
    started = time.monotonic()
    cli(env, "run", "--once", timeout=30)
    assert replies(home.conv("by-hand")) == ["Echo: hello"]
    assert time.monotonic() - started < 10  # waited for the settle window, not a retry


def test_respond_from_the_cli_answers_a_waiting_need(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(
        Step(text="NEED: The name of the release manager"), Step(text="Thanks, Ada it is.")
    )
    conv_id = cli_here(env, "new", "release", "--message", "Who signs off?").stdout.strip()
    conv = Conv(home.active / conv_id)
    wait_for(
        lambda: (st := read_state(conv)) is not None and st.status is Status.AWAITING_AGENT,
        what="awaiting agent",
    )
    out = cli_here(env, "respond", conv_id, "Ada Lovelace").stdout
    assert "answered need " in out and ": The name of the release manager" in out
    wait_for(lambda: replies(conv)[-1:] == ["Thanks, Ada it is."], what="the model carries on")
    response = parse(conv.log.read_bytes()).blocks[2]
    assert (
        response.response_to == "The name of the release manager"
        and "Ada Lovelace" in response.text
    )
    nothing = cli_here(env, "respond", conv_id, "again", "--need", "1", check=False)
    assert nothing.returncode == 1 and "waits for nothing from the agent" in nothing.stderr


def test_doctor_names_the_setting_a_template_source_lacks(home: Home, tmp_path: Path) -> None:
    """The hint meant for the user ("set tools.notes_vault") is the user's, in
    doctor: the model is only told that the source is not there
    (tests/unit/prompt/test_context.py)."""
    env = base_env(home)
    out = cli_here(env, "doctor", check=False).stdout
    assert (
        "warn template research gathers notes, but no notes vault is set: "
        "set tools.notes_vault in the config"
    ) in out, out
    vault = tmp_path / "vault"
    vault.mkdir()
    out = cli_here({**env, "CONTEMPLATION_TOOLS__NOTES_VAULT": str(vault)}, "doctor", check=False)
    assert "notes_vault" not in out.stdout, out.stdout
