"""The whole path in-process: inbox → pipeline → fake Ollama → messages.log → state → archive."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation.engine.pipeline import Runtime, process, process_safely
from contemplation.engine.tracking import Tracked
from contemplation.engine.turn import fit
from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.protocol import logformat
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store import logview
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.logview import LogView
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, open_writer, request_cancel
from tests.conftest import run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama, Step


def make_conv(home: Home, topic: str = "topic", model: str = "llama3.2", **meta: object) -> Conv:
    return new_conversation(
        home,
        topic,
        template=load_template(home, "default"),
        model=model,
        backend="ollama",
        extra=meta or None,
    )


def blocks(conv: Conv) -> list[tuple[BlockKind, str]]:
    return [(b.kind, b.text) for b in parse(conv.log.read_bytes()).blocks]


def runtime(make_settings: Callable[..., Settings], fake: FakeOllama, **kw: object) -> Runtime:
    return runtime_for(make_settings(fake, **kw))


def test_a_dropped_message_gets_one_streamed_reply_and_state(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "What is the best way to persist memory?")
    fake_ollama.enqueue(Step(text="Use an append-only log.", prompt_eval_count=50))
    run_burst(runtime(make_settings, fake_ollama))
    assert blocks(conv) == [
        (BlockKind.AGENT, "What is the best way to persist memory?"),
        (BlockKind.MODEL, "Use an append-only log."),
    ]
    st = read_state(conv)
    assert st is not None
    assert st.status is Status.IDLE and st.turns == 1 and st.messages_processed == 1
    assert st.last_turn is not None and st.last_turn.prompt_eval_count == 50
    assert st.intent is None and st.log.size == conv.log.stat().st_size
    assert list(conv.inbox.iterdir()) == [] and list(conv.processing.iterdir()) == []
    sent = fake_ollama.chat_requests()[-1]
    assert sent["messages"][0]["role"] == "system" and "NEED:" in sent["messages"][0]["content"]
    assert sent["messages"][1:] == [
        {"role": "user", "content": "What is the best way to persist memory?"}
    ]
    assert sent["options"]["num_ctx"] == 8192


def test_a_turn_reads_the_log_through_the_writers_descriptor(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """messages.log is opened twice in a whole turn: read once at first sight, and the
    session's read-write descriptor, which every later refresh of the parse reads through
    (before: five opens, one per refresh and one more at first sight)."""
    conv = make_conv(home)
    drop_message(conv, "first")
    fake_ollama.enqueue(Step(text="reply one"))
    opened: list[int] = []
    real_open = os.open

    def counting_open(path: str | os.PathLike[str], flags: int, *a: Any, **k: Any) -> int:
        if Path(path) == conv.log:
            opened.append(flags)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", counting_open)
    run_burst(runtime(make_settings, fake_ollama))
    assert blocks(conv) == [(BlockKind.AGENT, "first"), (BlockKind.MODEL, "reply one")]
    writes = [f for f in opened if f & os.O_RDWR]
    assert len(opened) == 2 and len(writes) == 1
    # the next message's turn: the view is current, so only the writer opens the log
    opened.clear()
    drop_message(conv, "second")
    fake_ollama.enqueue(Step(text="reply two"))
    run_burst(runtime(make_settings, fake_ollama))
    assert blocks(conv)[-2:] == [(BlockKind.AGENT, "second"), (BlockKind.MODEL, "reply two")]
    assert len(opened) == 2  # a new burst: a new view, read once, and the writer's descriptor
    sent = fake_ollama.chat_requests()[-1]["messages"]
    assert [m["content"] for m in sent[1:]] == ["first", "reply one", "second"]


@pytest.mark.parametrize("lag", [0.0, 0.3])
def test_a_reply_that_comes_while_the_committer_is_busy_is_one_state_write(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    lag: float,
) -> None:
    """The turn's start write is still queued when the whole reply is in (a committer busy
    with a burst, made certain here by a lag before it takes work): it is withdrawn, and
    the reply's commit is the turn's one state write. When the start write has begun by
    then (an idle committer, a model that takes its time): two writes, as before."""
    from contemplation.writer import durable as durable_mod

    monkeypatch.setattr(durable_mod, "COMMIT_LAG", lag)
    conv = make_conv(home)
    drop_message(conv, "question")
    # idle: the model takes its time (a first byte after 0.2 s), so the write has begun
    fake_ollama.enqueue(Step(text="the answer", chunks=3, first_byte_delay=0 if lag else 0.2))
    written: list[dict[str, Any]] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst) == conv.state:
            written.append(json.loads(Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    run_burst(runtime(make_settings, fake_ollama))
    assert blocks(conv) == [(BlockKind.AGENT, "question"), (BlockKind.MODEL, "the answer")]
    assert [w["status"] for w in written] == (["idle"] if lag else ["generating", "idle"])
    last = written[-1]
    assert last["intent"] is None and last["turns"] == 1 and last["messages_processed"] == 1
    assert last["log"]["size"] == conv.log.stat().st_size
    assert list(conv.processing.iterdir()) == []


@pytest.mark.parametrize("lag", [0.0, 0.3])
def test_a_turn_whose_state_writes_all_failed_is_recovered_in_the_same_process(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    lag: float,
) -> None:
    """The disk is full for every state write of a turn (the start, or the one merged
    write, and the error it tries to record): once there is room, the same daemon runs
    recovery again before anything else, so the claimed message is not appended twice and
    the cut turn is redone (a restart did so already; a running daemon did not)."""
    from contemplation.writer import durable as durable_mod

    monkeypatch.setattr(durable_mod, "COMMIT_LAG", lag)
    conv = make_conv(home)
    drop_message(conv, "question")
    full = [True]
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if full[0] and Path(dst) == conv.state:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    fake_ollama.enqueue(Step(text="cut answer", first_byte_delay=0 if lag else 0.2))
    rt = runtime(make_settings, fake_ollama)
    seen = Tracked()

    async def go() -> None:  # as the daemon runs them: a failure is logged, not raised
        await process_safely(conv, rt, seen)
        assert read_state(conv) is not None and list(conv.processing.iterdir())
        full[0] = False  # room again
        fake_ollama.enqueue(Step(text="the answer"))
        await process_safely(conv, rt, seen)
        await rt.aclose()

    asyncio.run(go())
    agent = [t for k, t in blocks(conv) if k is BlockKind.AGENT]
    assert agent == ["question"]  # taken once
    assert [t for k, t in blocks(conv) if k is BlockKind.MODEL][-1] == "the answer"
    st = read_state(conv)
    assert st is not None and st.intent is None and st.log.size == conv.log.stat().st_size
    assert list(conv.processing.iterdir()) == []


def test_a_long_log_is_parsed_and_fitted_off_the_loop(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long log at first sight is parsed, and a long history's request built and fitted,
    on a thread while the loop goes on (4 KB and 10 blocks stand here for LONG_PARSE's 256 KB
    and LONG_HISTORY's 200 blocks; a 10 MB log took ~90 ms to parse and ~100 ms to fit). Each
    call off the loop waits for a callback the loop must run meanwhile: on the loop it hangs."""
    monkeypatch.setattr(logview, "LONG_PARSE", 4096)
    monkeypatch.setattr(fit, "LONG_HISTORY", 10)
    conv = make_conv(home)
    with open_writer(conv, durable=False) as w:
        for i in range(20):
            w.append_block("CLAUDE", "OLLAMA", f"question {i} " + "q" * 300, msg_id=f"q{i}")
            w.append_block("OLLAMA", "CLAUDE", f"answer {i} " + "a" * 300, msg_id=f"a{i}")
    assert conv.log.stat().st_size > 4096
    drop_message(conv, "and now?")
    fake_ollama.enqueue(Step(text="now this."))
    rt = runtime(make_settings, fake_ollama)
    off_loop: dict[str, int] = {}

    async def scenario() -> None:
        loop, here = asyncio.get_running_loop(), threading.get_ident()

        def wrapped(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def call(*a: Any, **kw: Any) -> Any:
                if threading.get_ident() != here:
                    off_loop[name] = off_loop.get(name, 0) + 1
                    ran = threading.Event()
                    loop.call_soon_threadsafe(ran.set)
                    assert ran.wait(5), f"the loop was held during {name}"
                return real(*a, **kw)

            return call

        monkeypatch.setattr(LogView, "refresh", wrapped("parse", LogView.refresh))
        monkeypatch.setattr(fit, "fitted", wrapped("fit", fit.fitted))
        await process(conv, rt, Tracked())
        await rt.aclose()

    asyncio.run(scenario())
    assert off_loop == {"parse": 1, "fit": 1}  # the first sight's parse; the turn's request
    got = blocks(conv)
    assert len(got) == 42 and got[-2:] == [
        (BlockKind.AGENT, "and now?"),
        (BlockKind.MODEL, "now this."),
    ]
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.log.size == conv.log.stat().st_size


def test_messages_that_arrive_together_are_separate_turns_in_name_order(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    for name in ("b.txt", "a.txt", "c.txt"):
        (conv.inbox / name).write_text(f"message {name}")
    now = time.time() - 5
    for p in conv.inbox.iterdir():
        os.utime(p, (now, now))
    run_burst(runtime(make_settings, fake_ollama))
    got = blocks(conv)
    assert [k for k, _ in got] == [BlockKind.AGENT, BlockKind.MODEL] * 3
    assert [t for k, t in got if k is BlockKind.AGENT] == [
        "message a.txt",
        "message b.txt",
        "message c.txt",
    ]
    assert [t for k, t in got if k is BlockKind.MODEL] == [
        "Echo: message a.txt",
        "Echo: message b.txt",
        "Echo: message c.txt",
    ]
    # each turn sent the history so far
    assert [len(r["messages"]) for r in fake_ollama.chat_requests()] == [2, 4, 6]


def test_a_need_no_rule_matches_waits_for_the_agent_and_respond_resumes(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "Plan the migration")
    fake_ollama.enqueue(
        Step(
            text="I need data.\nNEED: The size of the production database\nNEED: The size of the production database"
        )
    )
    rt = runtime(make_settings, fake_ollama)
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.status is Status.AWAITING_AGENT
    assert st.pending_needs == ["The size of the production database"]
    drop_message(
        conv,
        "RESPONSE TO NEED: The size of the production database\n(source: agent)\n3 tables, 2 GB",
    )
    fake_ollama.enqueue(Step(text="Thanks. Done.\n=== COMPLETE ==="))
    run_burst(rt)
    archived = Conv(home.completed / conv.id)
    assert not conv.dir.exists() and archived.dir.is_dir()
    r = parse(archived.log.read_bytes())
    assert r.blocks[2].response_to == "The size of the production database"
    assert r.blocks[-1].complete and r.blocks[-1].text == "Thanks. Done."
    assert archived.log.read_text().rstrip().endswith("=== COMPLETE ===")
    st = read_state(archived)
    assert st is not None and st.status is Status.COMPLETE


def test_a_permanent_error_is_visible_and_the_agent_can_resume(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home, model="nosuchmodel")
    drop_message(conv, "hello?")
    rt = runtime(make_settings, fake_ollama)
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR
    assert st.last_error is not None and st.last_error.kind == "model_not_found"
    assert "=== ERROR: Ollama: model 'nosuchmodel' not found" in conv.log.read_text()
    assert len(fake_ollama.chat_requests()) == 1  # not retried
    run_burst(rt)
    assert len(fake_ollama.chat_requests()) == 1  # still not retried without a new message
    fake_ollama.models["nosuchmodel"] = {"capabilities": ["completion"], "arch": "x", "ctx": 4096}
    drop_message(conv, "try again")
    run_burst(rt)
    assert blocks(conv)[-1] == (BlockKind.MODEL, "Echo: try again")
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE


def test_transient_errors_retry_with_backoff_and_reply_exactly_once(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "ping")
    fake_ollama.enqueue(
        Step(kind="error", status=503, error="busy"),
        Step(kind="mid_error", text="partial words here", after_chunks=1),
        Step(kind="cut_close", text="another partial", after_chunks=1),
        Step(text="pong"),
    )
    rt = runtime(make_settings, fake_ollama)

    async def until_idle() -> None:
        for _ in range(200):
            wake = await process(conv, rt, Tracked())
            st = read_state(conv)
            if st is not None and st.status is Status.IDLE:
                return
            await asyncio.sleep(max(0.0, (wake or time.time()) - time.time()))
        raise AssertionError("never became idle")

    async def until_idle_closed() -> None:
        try:
            await until_idle()
        finally:
            await rt.aclose()

    asyncio.run(until_idle_closed())
    r = parse(conv.log.read_bytes())
    models = [b for b in r.blocks if b.kind is BlockKind.MODEL]
    assert [b.interrupted for b in models] == [True, True, False]
    assert models[-1].text == "pong"
    assert len(fake_ollama.chat_requests()) == 4
    # the history sent on the last try holds no cut-off reply
    assert [m["role"] for m in fake_ollama.chat_requests()[-1]["messages"]] == ["system", "user"]
    st = read_state(conv)
    assert st is not None and st.retry_count == 0 and st.turns == 1


def test_retry_gives_up_after_max_attempts(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "ping")
    fake_ollama.default_step = Step(kind="error", status=500, error="boom")
    rt = runtime(make_settings, fake_ollama, retry={"base": 0.001, "cap": 0.002, "max_attempts": 3})

    async def drive() -> None:
        for _ in range(50):
            await process(conv, rt, Tracked())
            st = read_state(conv)
            if st is not None and st.status is Status.ERROR:
                return
            await asyncio.sleep(0.005)
        await rt.aclose()

    asyncio.run(drive())
    st = read_state(conv)
    assert st is not None and st.status is Status.ERROR
    assert len(fake_ollama.chat_requests()) == 3
    assert "gave up after 3 attempts" in conv.log.read_text()


def test_cancel_stops_a_generation_for_real(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "write a long essay")
    fake_ollama.enqueue(Step(text=" ".join(["word"] * 400), chunk_delay=0.02))
    rt = runtime(make_settings, fake_ollama)

    def cancel_soon() -> None:
        deadline = time.time() + 10
        while time.time() < deadline:
            if b"word word" in conv.log.read_bytes():
                request_cancel(conv)
                return
            time.sleep(0.01)

    t = threading.Thread(target=cancel_soon)
    t.start()
    t0 = time.monotonic()
    run_burst(rt)
    t.join()
    assert time.monotonic() - t0 < 5  # far less than the 8 s the whole reply takes
    r = parse(conv.log.read_bytes())
    assert (MarkerKind.CANCELLED, "generation stopped by the agent") in r.blocks[-1].markers
    st = read_state(conv)
    assert st is not None and st.status is Status.CANCELLED
    assert not (conv.dir / ".cancel").exists()
    run_burst(rt)  # a cancelled turn is not retried
    assert len(fake_ollama.chat_requests()) == 1


def test_bad_inputs_are_kept_in_failed_with_a_reason_and_a_note(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    (conv.inbox / "empty.txt").write_text("   \n")
    (conv.inbox / "binary.bin").write_bytes(b"\x00\x01\x02abc")
    with open(conv.inbox / "huge.txt", "wb") as f:
        f.truncate(3 * 1024 * 1024)
    (conv.inbox / "latin1.txt").write_bytes(b"caf\xe9 ok")
    (conv.inbox / ".hidden").write_text("ignored")
    (conv.inbox / "draft.tmp").write_text("ignored")
    (conv.inbox / "-rf --no-preserve-root\nname with spaces").write_text("odd name is fine")
    old = time.time() - 5
    for p in conv.inbox.iterdir():
        os.utime(p, (old, old))
    run_burst(runtime(make_settings, fake_ollama))
    failed = sorted(p.name for p in conv.failed.iterdir())
    assert [n for n in failed if not n.endswith(".reason.json")] == sorted(
        n for n in failed if not n.endswith(".reason.json")
    )
    assert len([n for n in failed if n.endswith(".reason.json")]) == 3
    reasons = {json.loads(p.read_text())["reason"] for p in conv.failed.glob("*.reason.json")}
    assert any("max_message_bytes" in r for r in reasons)
    assert any("empty" in r for r in reasons)
    assert any("NUL" in r for r in reasons)
    agent_texts = [t for k, t in blocks(conv) if k is BlockKind.AGENT]
    assert sorted(agent_texts) == sorted(["caf\ufffd ok", "odd name is fine"])
    assert sorted(p.name for p in conv.inbox.iterdir()) == [".hidden", "draft.tmp"]
    assert conv.log.read_text().count("=== NOTE: message") == 3
    st = read_state(conv)
    assert st is not None and any("invalid UTF-8" in w for w in st.warnings)


def test_a_block_appended_by_hand_is_adopted_once_it_settles(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    first = drop_message(conv, "first")
    os.utime(first, (time.time() - 5, time.time() - 5))  # long settled
    rt = runtime(make_settings, fake_ollama, settle_seconds=0.2)
    run_burst(rt)
    with open(conv.log, "a") as f:
        f.write("\n" + logformat.header("CLAUDE", "OLLAMA") + "appended by hand\n")
    wake = run_burst(rt)[conv.id]
    assert wake is not None  # not yet settled: nothing written while a writer may be active
    assert len(fake_ollama.chat_requests()) == 1
    time.sleep(0.45)  # the settle window itself is what is being tested
    run_burst(rt)
    assert blocks(conv)[-2:] == [
        (BlockKind.AGENT, "appended by hand"),
        (BlockKind.MODEL, "Echo: appended by hand"),
    ]
    assert len(fake_ollama.chat_requests()) == 2


def test_a_folder_with_only_an_inbox_becomes_a_conversation(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = runtime(make_settings, fake_ollama)
    d = home.active / "conv_20260101-000000_dropped-in"
    (d / "inbox").mkdir(parents=True)
    (d / "inbox" / "m.txt").write_text("hello from a bare folder")
    os.utime(d / "inbox" / "m.txt", (time.time() - 5, time.time() - 5))
    run_burst(rt)
    conv = Conv(d)
    meta = json.loads(conv.metadata.read_text())
    assert meta["topic"] == "dropped in" and meta["backend"] == "ollama"
    assert blocks(conv)[-1] == (BlockKind.MODEL, "Echo: hello from a bare folder")


def test_a_folder_with_only_a_log_becomes_a_conversation(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = runtime(make_settings, fake_ollama)
    d = home.active / "conv_20260101-000000_log-only"
    d.mkdir(parents=True)
    (d / "messages.log").write_text(logformat.header("CLAUDE", "OLLAMA") + "hello from a log\n")
    run_burst(rt)
    conv = Conv(d)
    assert conv.inbox.is_dir() and conv.processing.is_dir()  # made at first sight
    assert json.loads(conv.metadata.read_text())["topic"] == "log only"
    assert blocks(conv) == [
        (BlockKind.AGENT, "hello from a log"),
        (BlockKind.MODEL, "Echo: hello from a log"),
    ]


def test_metadata_that_does_not_read_is_left_as_it_is_and_the_turn_waits_for_it(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A metadata.json caught half-saved (an editor writing it in place) or broken by an edit
    is the person's file: before, a folder with an inbox or a log was then taken for one made
    by hand, and its first save replaced the file with the defaults (model, options and the
    person's approvals gone). Now the message waits, the file untouched, until it reads."""
    rt = runtime(make_settings, fake_ollama)
    conv = make_conv(home, options={"temperature": 0.123})  # the person's own option
    whole = conv.metadata.read_bytes()
    for broken in (whole[: len(whole) // 2], b"", b'{"topic": 42}'):
        conv.metadata.write_bytes(broken)
        drop_message(conv, "wait for my metadata", name="m.txt")
        run_burst(rt)
        assert conv.metadata.read_bytes() == broken
        assert [p.name for p in conv.inbox.iterdir()] == ["m.txt"]
        assert fake_ollama.chat_requests() == []
        said = capsys.readouterr().out  # the daemon's log line says what is wrong with it
        assert "metadata.json does not read as a conversation's metadata (" in said, said
        (conv.inbox / "m.txt").unlink()
    conv.metadata.write_bytes(whole)  # the save completes: the next look answers
    drop_message(conv, "wait for my metadata", name="m.txt")
    run_burst(rt)
    assert blocks(conv)[-1] == (BlockKind.MODEL, "Echo: wait for my metadata")
    assert [r["options"]["temperature"] for r in fake_ollama.chat_requests()] == [0.123]
    assert json.loads(conv.metadata.read_text())["options"]["temperature"] == 0.123


def test_a_log_replaced_by_an_editor_is_reread_without_duplicates(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "one")
    rt = runtime(make_settings, fake_ollama)
    run_burst(rt)
    text = conv.log.read_text()
    tmp = conv.dir / "messages.log.swp"
    tmp.write_text(text.replace("Echo: one", "Echo: one (edited)"))
    os.replace(tmp, conv.log)
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and any("replaced" in w for w in st.warnings)
    assert len(fake_ollama.chat_requests()) == 1
    assert blocks(conv)[-1] == (BlockKind.MODEL, "Echo: one (edited)")
    # truncated by hand: re-baselined, and the now-unanswered message gets a turn
    with open(conv.log, "r+b") as f:
        f.truncate(conv.log.read_bytes().index(b"=== OLLAMA"))
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and any("shrank" in w for w in st.warnings)
    assert blocks(conv)[-1] == (BlockKind.MODEL, "Echo: one")


def test_context_window_filled_is_a_visible_warning(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "long history")
    fake_ollama.enqueue(Step(text="ok", prompt_eval_count=8190))
    run_burst(runtime(make_settings, fake_ollama))
    assert (
        "=== WARNING: the prompt (~8190 tokens) filled the context window (8192)"
        in conv.log.read_text()
    )
    st = read_state(conv)
    assert st is not None and st.last_turn is not None and st.last_turn.context_full


def test_two_models_share_one_slot_without_swapping_every_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    convs = [make_conv(home, f"a{i}", model="llama3.2") for i in range(3)] + [
        make_conv(home, f"b{i}", model="qwen3") for i in range(3)
    ]
    for c in convs:
        drop_message(c, "hi")
    fake_ollama.default_step = Step(chunk_delay=0.01)
    rt = runtime(make_settings, fake_ollama)
    run_burst(rt)
    order = [r["model"] for r in fake_ollama.chat_requests()]
    switches = sum(1 for a, b in zip(order, order[1:], strict=False) if a != b)
    assert sorted(order) == sorted(["llama3.2"] * 3 + ["qwen3"] * 3)
    assert switches == 1, order
    assert fake_ollama.max_active == 1


def test_thinking_is_kept_apart_from_the_answer(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home, model="qwen3")
    drop_message(conv, "think about it")
    fake_ollama.enqueue(
        Step(text="Answer.", thinking="NEED: Brain memory about secrets\n=== COMPLETE ===")
    )
    rt = runtime(make_settings, fake_ollama)
    run_burst(rt)
    drop_message(conv, "again")
    run_burst(rt)
    r = parse(conv.log.read_bytes())
    first = r.blocks[1]
    assert first.text == "Answer." and first.needs == () and not first.complete
    assert "NEED: Brain memory about secrets" in first.thinking
    assert fake_ollama.chat_requests()[-1]["messages"][2] == {
        "role": "assistant",
        "content": "Answer.",
    }


def _unused(p: Path) -> None:  # keep imports used by type checkers honest
    del p


def test_think_on_a_model_that_cannot_think_follows_the_policy(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    strict = make_conv(home, "strict", model="gemma")
    _set_meta(strict, think=True)
    drop_message(strict, "think hard")
    run_burst(runtime(make_settings, fake_ollama, think_unsupported="error"))
    st = read_state(strict)
    assert st is not None and st.status is Status.ERROR and st.last_error is not None
    assert "gemma cannot think" in st.last_error.message
    assert fake_ollama.chat_requests() == []  # refused before calling the model
    lenient = make_conv(home, "lenient", model="gemma")
    _set_meta(lenient, think="high")
    drop_message(lenient, "think hard")
    run_burst(runtime(make_settings, fake_ollama, think_unsupported="downgrade"))
    assert "think" not in fake_ollama.chat_requests()[-1]
    assert "=== NOTE: gemma cannot think" in lenient.log.read_text()
    assert blocks(lenient)[-1] == (BlockKind.MODEL, "Echo: think hard")


def _set_meta(conv: Conv, **fields: object) -> None:
    meta = json.loads(conv.metadata.read_text())
    meta.update(fields)
    conv.metadata.write_text(json.dumps(meta))
