"""A message written in place into ``inbox/`` is taken whole, however long its writer pauses.

The real daemon (a subprocess) and real writers: the test process holds the inbox file open
and writes in steps, each step after the daemon has said (on its JSON stderr) that it found
the file settled but still open for writing. A write that lands in the claimed file after
the claim joins the message while its turn has not started (the turn waits for the model's
one slot, held by another conversation), and is queued as a follow-up with a NOTE once it
has (the commit that releases the claimed file lags, ``CONTEMPLATION_COMMIT_LAG``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation.models import BlockKind, MarkerKind
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, processing_entries
from tests.conftest import DaemonProc, base_env, cli, cli_here, model_replies, wait_for
from tests.fakes.ollama_server import FakeOllama, Step

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="the writer check of Linux (leases, /proc)"
)


class DaemonEvents:
    """The daemon's JSON log lines (its stderr), read on a thread; tests wait on a condition."""

    def __init__(self, d: DaemonProc) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        assert d.proc.stderr is not None
        self._stream = d.proc.stderr
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

    def wait(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 10) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: any(pred(e) for e in self.events), timeout):
                raise AssertionError(f"timed out waiting for the daemon to log {what}")

    def being_written(self, name: str, size: int) -> None:
        """The daemon looked at inbox/<name> once it had settled and found it still open for
        writing, at ``size`` bytes."""
        self.wait(
            lambda e: (
                e.get("event") == "inbox_being_written"
                and e.get("file") == name
                and e.get("bytes") == size
            ),
            f"inbox/{name} ({size} bytes) still being written",
        )


def agent_texts(conv: Conv) -> list[str]:
    """The agent's messages in the log (a block's text ends without its last newline)."""
    return [b.text for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.AGENT]


def test_a_message_written_in_place_with_a_pause_reaches_the_log_whole(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)  # settle_seconds 0.2
    d = daemon_factory(env, home)
    events = DaemonEvents(d)
    d.wait_ready()
    conv = Conv(home.active / cli_here(env, "new", "typed").stdout.strip())
    # ( printf 'part one\n'; <a pause>; printf 'part two\n' ) > inbox/typed.txt
    with open(conv.inbox / "typed.txt", "w") as f:
        f.write("part one\n")
        f.flush()
        events.being_written("typed.txt", 9)  # the pause: longer than settle_seconds
        f.write("part two\n")
    wait_for(lambda: model_replies(conv), what="the reply")
    assert agent_texts(conv) == ["part one\npart two"]
    assert model_replies(conv) == ["Echo: part one\npart two"]
    assert not (conv.dir / "failed").exists() or not list((conv.dir / "failed").iterdir())


def test_a_writer_holding_the_file_open_across_pauses_is_waited_for_and_shown(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    d = daemon_factory(env, home)
    events = DaemonEvents(d)
    d.wait_ready()
    conv_id = cli_here(env, "new", "held").stdout.strip()
    conv = Conv(home.active / conv_id)
    lines = [f"line {i}\n" for i in range(4)]
    size = 0
    with open(conv.inbox / "held.txt", "w") as f:
        for i, line in enumerate(lines):
            f.write(line)
            f.flush()
            size += len(line)
            events.being_written("held.txt", size)  # settled, still open: left where it is
            if i == 1:  # the faces say which file is still being written
                status = cli_here(env, "status", conv_id).stdout
                assert "inbox/held.txt is still being written" in status, status
                data = json.loads(cli_here(env, "status", conv_id, "--json").stdout)
                assert data["being_written"] == ["held.txt"]
                doctor = cli_here(env, "doctor", check=False).stdout
                assert f"{conv_id}/inbox/held.txt is still being written" in doctor, doctor
        assert (conv.inbox / "held.txt").exists() and not processing_entries(conv)
    wait_for(lambda: model_replies(conv), what="the reply")
    assert agent_texts(conv) == ["".join(lines).rstrip("\n")]
    assert "being written" not in cli_here(env, "status", conv_id).stdout


def test_a_write_into_the_claimed_file_before_its_turn_joins_the_message(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    env = base_env(home, fake_ollama)
    daemon_factory(env, home).wait_ready()
    busy = cli_here(env, "new", "busy").stdout.strip()
    fake_ollama.enqueue(Step(kind="hang", after_chunks=1))
    cli_here(env, "send", busy, "hold the model's one slot")
    wait_for(fake_ollama.chat_arrived.is_set, what="the first turn holding the slot")
    conv = Conv(home.active / cli_here(env, "new", "late").stdout.strip())
    cli_here(env, "send", conv.id, "-", input="part one\n")
    # claimed and its block written; its turn waits for the slot
    wait_for(
        lambda: agent_texts(conv) and processing_entries(conv), what="the claimed message's block"
    )
    [claimed] = processing_entries(conv)
    with open(claimed, "a") as f:  # a write that lands after the claim
        f.write("part two\n")
    cli_here(env, "cancel", busy)  # the slot is free: the turn starts
    wait_for(lambda: model_replies(conv), what="the reply")
    assert agent_texts(conv) == ["part one\npart two"]  # one message, whole
    assert fake_ollama.chat_requests()[-1]["messages"][-1]["content"] == "part one\npart two"
    assert model_replies(conv) == ["Echo: part one\npart two"]


def test_a_write_into_the_claimed_file_after_its_turn_began_is_a_follow_up(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    # the state write that releases the claimed file waits a second in the group committer,
    # while the request is already at the model
    env = base_env(home, fake_ollama, CONTEMPLATION_TESTING="1", CONTEMPLATION_COMMIT_LAG="1")
    daemon_factory(env, home).wait_ready()
    conv = Conv(home.active / cli(env, "new", "follow").stdout.strip())
    cli(env, "send", conv.id, "-", input="part one\n")
    wait_for(fake_ollama.chat_arrived.is_set, what="the turn's request at the model")
    [claimed] = processing_entries(conv)  # not released yet
    with open(claimed, "a") as f:
        f.write("part two\n")
    wait_for(lambda: len(model_replies(conv)) == 2, what="a reply to the follow-up", timeout=30)
    assert agent_texts(conv) == ["part one", "part two"]
    blocks = parse(conv.log.read_bytes()).blocks
    notes = [t for b in blocks for k, t in b.markers if k is MarkerKind.NOTE]
    assert any("written into it after it was taken" in t for t in notes), notes
    wait_for(  # the follow-up's file goes with its commit (which lags too)
        lambda: not processing_entries(conv) and not list(conv.inbox.iterdir()),
        what="nothing left queued",
    )
