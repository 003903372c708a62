"""Backend, filesystem and load faults: the daemon keeps every message and keeps going."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import pytest

from contemplation import backends
from contemplation.backends.base import Capabilities, Check
from contemplation.engine.breaker import Breaker
from contemplation.engine.pipeline import process
from contemplation.engine.runtime import Runtime
from contemplation.engine.tracking import Tracked
from contemplation.models import BlockKind, ChatRequest, Status, StreamEvent, Usage
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, list_conversations, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import procgroups
from tests.conftest import ROOT, base_env, run_burst, wait_for
from tests.fakes.ollama_server import FakeOllama, Step


def make(home: Home, topic: str = "t", model: str = "llama3.2", backend: str = "ollama") -> Conv:
    return new_conversation(
        home, topic, template=load_template(home, "default"), model=model, backend=backend
    )


def replies(conv: Conv) -> list[str]:
    return [
        b.text
        for b in parse(conv.log.read_bytes()).blocks
        if b.kind is BlockKind.MODEL and not b.interrupted and not b.markers
    ]


# --------------------------------------------------------------------------- backend faults


def test_breaker_opens_probes_once_and_backs_off() -> None:
    now = [0.0]
    b = Breaker(threshold=3, cooldown=10, clock=lambda: now[0])
    for _ in range(3):
        assert b.allow()
        b.failure()
    assert not b.allow()  # open
    now[0] = 10.5
    assert b.allow()  # the one probe
    assert not b.allow()
    b.failure()  # probe failed: twice as long
    now[0] = 25
    assert not b.allow()
    now[0] = 31
    assert b.allow()
    b.success()
    assert b.allow() and b.allow()


def test_a_500_storm_does_not_hammer_the_server(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    convs = [make(home, f"storm {i}") for i in range(10)]
    for c in convs:
        drop_message(c, "hello?")
    fake_ollama.default_step = Step(kind="error", status=500, error="model runner crashed")
    s = make_settings(
        fake_ollama, retry={"base": 0.01, "cap": 0.02}, breaker_threshold=3, breaker_cooldown=30
    )
    rt = Runtime(settings=s, home=Home(s.home))
    seen = Tracked()

    async def storm() -> None:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            await asyncio.gather(*(process(c, rt, seen) for c in convs))
            await asyncio.sleep(0.02)
        await rt.aclose()

    asyncio.run(storm())
    calls = len(fake_ollama.chat_requests())
    assert 3 <= calls <= 6, calls  # the threshold, plus a few already in flight
    st = read_state(convs[-1])
    assert st is not None and st.status is Status.RETRYING
    assert st.last_error is not None and st.last_error.kind in {"circuit_open", "server_error"}


def test_the_server_coming_back_answers_every_message_once(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    convs = [make(home, f"back {i}") for i in range(4)]
    for c in convs:
        drop_message(c, "still there?")
    fake_ollama.default_step = Step(kind="error", status=503, error="busy")
    s = make_settings(
        fake_ollama, retry={"base": 0.01, "cap": 0.02}, breaker_threshold=2, breaker_cooldown=0.2
    )
    rt = Runtime(settings=s, home=Home(s.home))
    seen = Tracked()

    async def go() -> None:
        for i in range(200):
            if i == 20:
                fake_ollama.default_step = Step()
            await asyncio.gather(*(process(c, rt, seen) for c in convs))
            if all(replies(c) for c in convs):
                break
            await asyncio.sleep(0.02)
        await rt.aclose()

    asyncio.run(go())
    assert [replies(c) for c in convs] == [["Echo: still there?"]] * 4


# --------------------------------------------------------------------------- filesystem faults


def _limit_file_size(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_during_append_keeps_the_message_and_resumes(
    home: Home, fake_ollama: FakeOllama
) -> None:
    conv = make(home)
    # 50,000 characters: past the 20,000-byte file limit below, and (~12,500 tokens) past the
    # fake's default window, which refuses a prompt it cannot hold as Ollama does when told
    # "truncate": false; the window is made to hold it, the disk is what this test is about
    meta = json.loads(conv.metadata.read_text())
    conv.metadata.write_text(json.dumps({**meta, "options": {"num_ctx": 32768}}))
    drop_message(conv, "x" * 50_000, name="big.msg")
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    proc = subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_file_size(20_000),
    )
    # a clear error, the daemon survived, and its exit says the conversation was not done
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "File too large" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"run --once: 1 conversation not done ({conv.id}: File too large (errno 27))"
    assert conv.log.read_bytes() == b""  # the torn append was rolled back
    assert [p.name.endswith("big.msg") for p in conv.processing.iterdir()] == [True]
    st = read_state(conv)
    assert st is not None and st.intent is None
    proc = subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    blocks = parse(conv.log.read_bytes()).blocks
    assert [b.kind for b in blocks] == [BlockKind.AGENT, BlockKind.MODEL]
    assert blocks[0].text == "x" * 50_000


def test_disk_full_during_a_state_write_leaves_the_old_state(
    home: Home, fake_ollama: FakeOllama
) -> None:
    conv = make(home)
    drop_message(conv, "hello")
    before = conv.state.read_bytes()
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    proc = subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_file_size(300),
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(f"({conv.id}: File too large (errno 27))")
    assert conv.state.read_bytes() == before  # never a torn state.json
    assert not list(conv.dir.glob(".state.json.tmp.*"))
    subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert replies(conv) == ["Echo: hello"]


def test_a_broken_conversation_does_not_block_the_others(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    broken, fine = make(home, "broken"), make(home, "fine")
    broken.lock.unlink(missing_ok=True)
    broken.lock.mkdir()  # cannot be opened for locking
    drop_message(broken, "hi")
    drop_message(fine, "hi")
    deleted = make(home, "deleted")
    drop_message(deleted, "hi")
    s = make_settings(fake_ollama)
    rt = Runtime(settings=s, home=Home(s.home))
    import shutil

    shutil.rmtree(deleted.dir)
    run_burst(rt)
    assert replies(fine) == ["Echo: hi"]
    assert replies(broken) == []


# the daemon as `contemplation run` starts it, with a watcher that never reports an event
DEAD_WATCHER_DAEMON = """
import asyncio, sys
from contemplation import settings
from contemplation.daemon import root as daemon
from contemplation.daemon import watcher

watcher.InotifyWatcher.start = lambda self: None
watcher.InotifyWatcher.ensure_alive = lambda self: False
sys.exit(asyncio.run(daemon.serve(settings.load())))
"""


def test_the_rescan_finds_work_when_no_event_arrives(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    first = make(home, "found at start")
    drop_message(first, "first")
    env = base_env(
        home, fake_ollama, CONTEMPLATION_RESCAN_INTERVAL="0.3", CONTEMPLATION_SETTLE_SECONDS="0.1"
    )
    with (tmp_path / "stderr").open("wb") as err:
        d = procgroups.popen(
            [sys.executable, "-c", DEAD_WATCHER_DAEMON], env=env, cwd=ROOT, stdout=err, stderr=err
        )
    try:
        # answered: the start-up scan is over, so only a rescan can find the next one
        wait_for(lambda: replies(first) or d.poll() is not None, 30, what="the start-up scan")
        assert replies(first) == ["Echo: first"], (tmp_path / "stderr").read_text()
        conv = make(home, "no events")
        drop_message(conv, "anyone?")
        wait_for(lambda: replies(conv) or d.poll() is not None, 30, what="the rescan")
        d.send_signal(signal.SIGTERM)  # the daemon's, never pytest's own process
        assert d.wait(30) == 0, (tmp_path / "stderr").read_text()
    finally:
        procgroups.kill(d)
    assert replies(conv) == ["Echo: anyone?"]


def test_a_100_mb_message_is_refused_without_reading_it(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make(home)
    with open(conv.inbox / "huge.txt", "wb") as f:
        f.truncate(100 * 1024 * 1024)
    os.utime(conv.inbox / "huge.txt", (time.time() - 5, time.time() - 5))
    s = make_settings(fake_ollama)
    tracemalloc.start()
    run_burst(Runtime(settings=s, home=Home(s.home)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 20 * 1024 * 1024
    [kept] = [p for p in conv.failed.iterdir() if p.name.endswith("huge.txt")]
    assert kept.stat().st_size == 100 * 1024 * 1024
    assert "larger than max_message_bytes" in conv.log.read_text()


# --------------------------------------------------------------------------- load


def test_the_concurrency_limit_holds_and_every_conversation_gets_its_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    convs = [make(home, f"c{i}") for i in range(12)]
    for c in convs:
        drop_message(c, "hello")
    fake_ollama.default_step = Step(chunk_delay=0.05)
    s = make_settings(fake_ollama, ollama={"concurrency": 4})
    run_burst(Runtime(settings=s, home=Home(s.home)))
    assert fake_ollama.max_active == 4
    assert all(replies(c) == ["Echo: hello"] for c in convs)


class CountingBackend:
    name = "counting"
    label = "COUNTING"
    concurrency = 8

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self.calls = 0

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        self.active += 1
        self.calls += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(0)
            yield StreamEvent("content", text="ok")
            yield StreamEvent("done", usage=Usage(eval_count=1))
        finally:
            self.active -= 1

    async def capabilities(self, model: str) -> Capabilities:
        return Capabilities()

    async def check(self, model: str | None) -> list[Check]:
        return []

    async def forget(self, conversation_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_a_thousand_conversations_each_get_exactly_one_reply(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    counting = CountingBackend()
    backends.register("counting", lambda s: counting)
    tpl = load_template(home, "default")
    for i in range(1000):
        conv = new_conversation(
            home, f"load {i}", template=tpl, model="m", backend="counting", durable=False
        )
        drop_message(conv, f"m{i}")
    s = make_settings(durability="none")
    t0 = time.monotonic()
    run_burst(Runtime(settings=s, home=Home(s.home)))
    elapsed = time.monotonic() - t0
    assert counting.calls == 1000
    assert counting.max_active == 8
    for conv in list_conversations(home):
        assert replies(conv) == ["ok"]
    assert elapsed < 60


@pytest.mark.slow
def test_soak_ten_thousand_messages_keeps_fds_threads_and_memory_flat(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    counting = CountingBackend()
    backends.register("counting", lambda s: counting)
    tpl = load_template(home, "default")
    convs = [
        new_conversation(
            home, f"soak {i}", template=tpl, model="m", backend="counting", durable=False
        )
        for i in range(100)
    ]
    s = make_settings(durability="none")
    rt = Runtime(settings=s, home=Home(s.home))
    samples = []
    for round_ in range(100):
        for c in convs:
            drop_message(c, f"message {round_}")
        run_burst(rt)
        if round_ % 10 == 9:
            import gc

            gc.collect()
            fds = len(os.listdir("/proc/self/fd"))
            rss = int(
                next(
                    ln.split()[1]
                    for ln in Path("/proc/self/status").read_text().splitlines()
                    if ln.startswith("VmRSS")
                )
            )
            import threading

            samples.append((fds, threading.active_count(), rss))
    assert counting.calls == 10_000
    first, last = samples[1], samples[-1]
    assert last[0] <= first[0] + 2, samples
    assert last[1] <= first[1], samples
    assert last[2] < first[2] * 1.5, samples


def _unused() -> None:
    wait_for(lambda: True)


def test_429_retry_after_is_honoured(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make(home)
    drop_message(conv, "hi")
    fake_ollama.enqueue(Step(kind="error", status=429, error="slow down", retry_after="30"))
    s = make_settings(fake_ollama, retry={"base": 0.01, "cap": 120})
    before = time.time()
    run_burst(Runtime(settings=s, home=Home(s.home)))
    st = read_state(conv)
    assert st is not None and st.status is Status.RETRYING and st.next_retry_at is not None
    assert st.next_retry_at >= before + 30  # not the 10 ms backoff: the server's wish
    run_burst(Runtime(settings=s, home=Home(s.home)))
    assert len(fake_ollama.chat_requests()) == 1  # nothing sent before the time is up


def test_a_gigantic_reply_is_cut_at_max_reply_bytes(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make(home)
    drop_message(conv, "say everything")
    fake_ollama.enqueue(Step(text="word " * 400_000, chunks=2000))  # 2 MB
    s = make_settings(fake_ollama, max_reply_bytes=64 * 1024)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    blocks = parse(conv.log.read_bytes()).blocks
    assert 64 * 1024 <= len(blocks[-1].text) < 64 * 1024 + 4096
    assert any("max_reply_bytes" in t for _, t in blocks[-1].markers)
    assert conv.log.stat().st_size < 80 * 1024
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.turns == 1
