"""The claim's durability is off the first token's path: a message's request goes out while
its claim (its name in ``processing/``, then its inbox name's removal) is made durable, and
nothing that counts the message is committed before that.

* in process, with ``os.fsync`` watched: the fsync of ``processing/`` is held until the
  scripted server has the request (it waits for it, bounded), and every ``state.json`` and
  fsync is recorded in order;
* a real daemon under the power-cut journal (``tests/powercut.py``), killed at its claim and
  rolled back to a cut just before ``processing/`` was durable: the message is in ``inbox/``,
  nothing of it is committed, and the next run answers it once.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation.engine.runtime import Runtime
from contemplation.models import BlockKind
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.logview import LogView
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import powercut
from tests.conftest import ROOT, base_env, run_burst
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_crash import run_once

WAIT_FOR_REQUEST = 5.0  # s: how long the held fsync of processing/ waits for the request


def _conv(home: Home, topic: str = "claims") -> Conv:
    tpl = load_template(home, "default")
    return new_conversation(home, topic, template=tpl, model="llama3.2", backend="ollama")


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class Watch:
    """``os.fsync`` and ``os.replace`` of this process, watched: the fsync of a
    ``processing/`` folder waits (bounded) for the server's first chat request; each fsync
    and each state.json replaced is recorded in order."""

    def __init__(self, fake: FakeOllama, real_fsync: Callable[[int], None]) -> None:
        self.fake = fake
        self.real_fsync = real_fsync
        self.real_replace = os.replace
        self.lock = threading.Lock()
        self.events: list[tuple[str, Any]] = []
        self.request_before_claim_durable: list[bool] = []

    def fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        path = _fd_path(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode) and path.endswith("/processing"):
            deadline = time.monotonic() + WAIT_FOR_REQUEST
            while not self.fake.chat_requests() and time.monotonic() < deadline:
                time.sleep(0.005)  # polled: the request comes from the loop's thread
            self.request_before_claim_durable.append(bool(self.fake.chat_requests()))
        self.real_fsync(fd)
        with self.lock:
            self.events.append(("fsync", path))

    def replace(self, src: Any, dst: Any, **kw: Any) -> None:
        data = None
        if Path(dst).name == "state.json":
            data = json.loads(Path(src).read_bytes())
        self.real_replace(src, dst, **kw)
        if data is not None:
            with self.lock:
                self.events.append(("state", data["messages_processed"]))


def test_the_request_leaves_before_the_claim_is_durable_and_nothing_is_committed_before_it(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim's fsync of processing/ stood between the drop and the request (held here
    until the request comes, it timed out: no request). Now the request goes out first; the
    claim is made durable with the reply's first state write, and no state.json counts the
    message before processing/ was fsynced with it and inbox/ without it."""
    fake_ollama.default_step = Step(chunks=3)
    conv = _conv(home)
    drop_message(conv, "the first", name="000.msg")
    watch = Watch(fake_ollama, os.fsync)
    monkeypatch.setattr(os, "fsync", watch.fsync)
    monkeypatch.setattr(os, "replace", watch.replace)
    run_burst(Runtime(settings=make_settings(fake_ollama, durability="fsync"), home=home))
    monkeypatch.undo()

    assert watch.request_before_claim_durable == [True]
    inbox, processing = str(conv.inbox), str(conv.processing)
    events = watch.events
    claimed = events.index(("fsync", processing))
    counted = next(i for i, e in enumerate(events) if e[0] == "state" and e[1] >= 1)
    inbox_synced = [i for i, e in enumerate(events) if e == ("fsync", inbox)]
    assert claimed < counted, events
    assert any(claimed < i < counted for i in inbox_synced), events  # its inbox name gone
    assert [b.text for b in LogView(conv).refresh().blocks] == ["the first", "Echo: the first"]
    assert list(conv.inbox.iterdir()) == [] and list(conv.processing.iterdir()) == []
    assert len(fake_ollama.chat_requests()) == 1


def _journaled(journal: Path, env: dict[str, str], *args: str) -> int:
    cmd = [sys.executable, "-m", "tests.powercut", str(journal), "--", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, timeout=120).returncode


def _calls_before(journal: Path, folder: Path, name_part: str) -> int:
    """How many of the journal's calls came before the first fsync of ``folder`` whose
    entries name ``name_part`` (the claim's point)."""
    ident = powercut.ident(folder)
    calls: list[str] = []
    for line in journal.read_text().splitlines():
        rec = json.loads(line)
        if rec["call"] not in calls:
            calls.append(rec["call"])
        if rec.get("dir") == ident and any(name_part in n for n in rec["entries"]):
            return calls.index(rec["call"])
    raise AssertionError(f"no fsync of {folder} named {name_part}")


@pytest.mark.parametrize("point", ["claim_linked", "claim"])
def test_a_power_cut_before_the_claim_is_durable_leaves_the_message_queued_and_it_is_answered_once(
    tmp_path: Path, point: str
) -> None:
    """The daemon killed at its claim (its request may have gone out), the power cut just
    before processing/ was fsynced with the message: the message is in inbox/, its block is
    not in the log and nothing counts it; the next run answers it once."""
    fake = FakeOllama().start()
    fake.default_step = Step(chunks=4)
    home = Home(tmp_path / "home")
    conv = _conv(home)
    drop_message(conv, "the first", name="000.msg")
    journal = tmp_path / "journal"
    env = base_env(home, fake, CONTEMPLATION_SETTLE_SECONDS="0", CONTEMPLATION_DURABILITY="fsync")
    crash = {**env, "CONTEMPLATION_TESTING": "1", "CONTEMPLATION_CRASH_AT": point}
    try:
        baseline = powercut.snapshot(home.root)
        assert _journaled(journal, crash, "run", "--once") == -9
        upto = _calls_before(journal, conv.processing, "000.msg")
        powercut.cut(home.root, baseline, journal, upto)
        assert [p.name for p in conv.inbox.iterdir()] == ["000.msg"]
        assert not LogView(conv).refresh().blocks
        state = read_state(conv)
        assert state is None or state.messages_processed == 0
        assert run_once(env, timeout=120) == 0
        blocks = LogView(conv).refresh().blocks
        assert [(b.kind, b.text) for b in blocks] == [
            (BlockKind.AGENT, "the first"),
            (BlockKind.MODEL, "Echo: the first"),
        ]
        assert list(conv.inbox.iterdir()) == [] and list(conv.processing.iterdir()) == []
        state = read_state(conv)
        assert state is not None and state.messages_processed == 1 and state.turns == 1
    finally:
        fake.stop()
