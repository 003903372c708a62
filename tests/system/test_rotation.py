"""Log rotation: renames under the conversation lock that a real ``tail -F`` follows, crash safe,
and the whole conversation (every segment) still reaches the model."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.engine.pipeline import Runtime, process_pending
from contemplation.faces.reading import blocks_since, log_text, segments
from contemplation.settings import Settings
from contemplation.store import logview
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.logview import LogView, log_segments
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from contemplation.writer.recovery import recover
from tests.conftest import ROOT, wait_for
from tests.fakes.ollama_server import FakeOllama

LIMIT = 2048


def make_conv(home: Home) -> Conv:
    return new_conversation(
        home,
        "rotation",
        template=load_template(home, "default"),
        model="llama3.2",
        backend="ollama",
    )


def exchange(conv: Conv, i: int, limit: int = LIMIT) -> bool:
    """One message and one reply, then a rotation if due; True when it rotated."""
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", f"question line-{i:04d} " + "q" * 150, msg_id=f"m{i}")
        r = w.reply("OLLAMA", "CLAUDE", f"r{i}")
        r.content(f"answer line-{i:04d} " + "a" * 150)
        r.finish()
        return w.maybe_rotate(limit)


def test_a_locked_view_read_through_the_writers_descriptor_matches_a_fresh_parse(
    home: Home,
) -> None:
    """refresh(fd=...) reads appends through the descriptor (the last block again, as it
    may have been unfinished) and reads a new file whole, with its rotated segments."""
    conv = make_conv(home)
    view = LogView(conv, locked=True)
    for i in range(30):
        with open_writer(conv) as w:
            w.append_block(
                "CLAUDE", "OLLAMA", f"question line-{i:04d} " + "q" * 150, msg_id=f"m{i}"
            )
            r = w.reply("OLLAMA", "CLAUDE", f"r{i}")
            r.content(f"answer line-{i:04d} half ")  # an unfinished block, read as it is
            assert w.fd is not None
            half = view.refresh(fd=w.fd)
            assert half.blocks[-1].text.startswith(f"answer line-{i:04d} half")
            r.content("a" * 150)
            r.finish()
            got = view.refresh(fd=w.fd)
            assert got == LogView(conv).refresh()
            assert got.blocks[-1].text == f"answer line-{i:04d} half " + "a" * 150
            rotated = w.maybe_rotate(LIMIT)
        if rotated:  # the new messages.log: read whole through the next writer's descriptor
            with open_writer(conv) as w:
                w.check_identity()
                w.append_fd()
                assert w.fd is not None
                assert view.refresh(fd=w.fd) == LogView(conv).refresh()
    assert len(log_segments(conv)) >= 3
    texts = [b.text.split(" ")[1] for b in view.result.blocks]
    assert texts == [f"line-{i // 2:04d}" for i in range(60)]


def test_a_refresh_says_when_it_would_parse_a_long_stretch(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """long_refresh is True exactly when refresh would parse more than LONG_PARSE bytes: a
    long log at first sight, a long block appended, any log with rotated segments behind it
    (read whole again after each rotation); False for what a turn usually appends."""
    monkeypatch.setattr(logview, "LONG_PARSE", 4096)
    conv = make_conv(home)
    view = LogView(conv, locked=True)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "short", msg_id="m0")
        assert not view.long_refresh(fd=w.fd)
        view.refresh(fd=w.fd)
        w.append_block("OLLAMA", "CLAUDE", "x" * 5000, msg_id="m1")
        assert view.long_refresh(fd=w.fd)  # the appended block is long
        view.refresh(fd=w.fd)
        w.append_block("CLAUDE", "OLLAMA", "short again", msg_id="m2")
        assert view.long_refresh(fd=w.fd)  # the last (long) block is parsed again
        view.refresh(fd=w.fd)
        w.append_block("OLLAMA", "CLAUDE", "short too", msg_id="m3")
        assert not view.long_refresh(fd=w.fd)  # the last block again, and the new one
        view.refresh(fd=w.fd)
        assert not view.long_refresh(fd=w.fd)  # nothing new
    assert LogView(conv, locked=True).long_refresh()  # first sight of a long log
    for i in range(6):
        exchange(conv, i, limit=LIMIT)
    assert len(log_segments(conv)) >= 2
    with open_writer(conv) as w:
        names = w.folder_names
        fresh = LogView(conv, locked=True)
        assert conv.log.stat().st_size < 4096 and fresh.long_refresh(names=names)
        fresh.refresh(names=names)
        assert not fresh.long_refresh(names=names)


def test_rotation_renames_segments_oldest_highest_and_keeps_every_block(home: Home) -> None:
    conv = make_conv(home)
    rotations = sum(exchange(conv, i) for i in range(40))
    names = [p.name for p in log_segments(conv)]
    assert rotations >= 3
    assert names == [f"messages.{n}.log" for n in range(rotations, 0, -1)] + ["messages.log"]
    # oldest has the highest number: question 0 is in the last-numbered segment
    assert b"line-0000" in (conv.dir / f"messages.{rotations}.log").read_bytes()
    # every segment holds whole blocks only and never passes the limit by more than a block
    for p in log_segments(conv)[:-1]:
        data = p.read_bytes()
        assert LIMIT <= len(data) < LIMIT + 1024
        assert data.endswith(b"\n")
    # the new live log starts with the CONTINUED system line, which is not a parse error
    assert conv.log.read_bytes().startswith(b"=== CONTINUED: ")
    result = LogView(conv).refresh()
    assert result.errors == ()
    texts = [b.text.split(" ")[1] for b in result.blocks]
    assert texts == [f"line-{i // 2:04d}" for i in range(80)]
    st = read_state(conv)
    assert st is not None and st.rotation is None
    assert st.log.size == conv.log.stat().st_size and st.log.ino == conv.log.stat().st_ino


def test_no_rotation_while_a_write_is_in_flight_or_bytes_are_foreign(home: Home) -> None:
    conv = make_conv(home)
    for i in range(10):
        exchange(conv, i, limit=10**9)
    with open_writer(conv) as w:
        with open(conv.log, "ab") as f:  # a hand append not yet adopted
            f.write(b"\n=== CLAUDE -> OLLAMA [2026-01-01 00:00:00] ===\nby hand\n")
        assert not w.maybe_rotate(LIMIT)
        w.adopt_foreign()
        r = w.reply("OLLAMA", "CLAUDE", "streaming")
        r.content("half a reply")
        assert not w.maybe_rotate(LIMIT)  # mid-reply: intent recorded
        r.finish()
        assert w.maybe_rotate(LIMIT)
    assert [p.name for p in log_segments(conv)] == ["messages.1.log", "messages.log"]


def test_tail_F_follows_rotation_and_sees_every_line(home: Home) -> None:
    if shutil.which("tail") is None:
        pytest.skip("no tail")
    conv = make_conv(home)
    tail = subprocess.Popen(
        ["tail", "-F", "-n", "+1", str(conv.log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    seen = bytearray()
    assert tail.stdout is not None
    out = tail.stdout
    os.set_blocking(out.fileno(), False)

    def saw(marker: bytes) -> bool:
        chunk = out.read()
        if chunk:
            seen.extend(chunk)
        return marker in seen

    try:
        exchange(conv, 0)
        wait_for(lambda: saw(b"answer line-0000"), timeout=10, what="tail -F to start following")
        rotations = sum(exchange(conv, i) for i in range(1, 120))
        assert rotations >= 8
        wait_for(lambda: saw(b"answer line-0119"), timeout=20, what="tail -F to reach the end")
    finally:
        tail.kill()
        tail.wait()
    text = seen.decode()
    for i in range(120):
        assert f"question line-{i:04d}" in text, i
        assert f"answer line-{i:04d}" in text, i
    assert text.count("question line-") == 120  # nothing twice


CRASH_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from contemplation.store.layout import Conv
    from contemplation.writer import open_writer
    conv = Conv(Path(sys.argv[1]))
    with open_writer(conv) as w:
        w.rotate()
    """
)


@pytest.mark.parametrize("point", ["rotate", "rotate_renamed"])
def test_a_crash_during_rotation_is_completed_by_recovery(home: Home, point: str) -> None:
    conv = make_conv(home)
    for i in range(30):
        exchange(conv, i)
    before = LogView(conv).refresh().blocks
    n_before = len(log_segments(conv))
    env = dict(os.environ, CONTEMPLATION_TESTING="1", CONTEMPLATION_CRASH_AT=f"{point}:1")
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(conv.dir)], env=env, cwd=ROOT, check=False
    )
    assert proc.returncode == -9
    st = read_state(conv)
    assert st is not None and st.rotation is not None  # journaled before any rename
    with open_writer(conv) as w:
        done = recover(w)
    assert any("rotated" in d for d in done)
    st = read_state(conv)
    assert st is not None and st.rotation is None
    names = [p.name for p in log_segments(conv)]
    assert names == [f"messages.{n}.log" for n in range(n_before, 0, -1)] + ["messages.log"]
    assert conv.log.exists() and st.log.ino == conv.log.stat().st_ino
    after = LogView(conv).refresh().blocks
    assert [b.text for b in after] == [b.text for b in before]
    exchange(conv, 99)  # and writing goes on
    assert LogView(conv).refresh().blocks[-1].text.startswith("answer line-0099")


def test_cursors_stay_valid_across_a_rotation(home: Home) -> None:
    conv = make_conv(home)
    for i in range(5):
        exchange(conv, i, limit=10**9)
    first = blocks_since(conv, 0)
    assert len(first.blocks) == 10
    with open_writer(conv) as w:
        w.rotate()
    exchange(conv, 5, limit=10**9)
    later = blocks_since(conv, first.cursor)
    assert [b["text"].split(" ")[1] for b in later.blocks] == ["line-0005", "line-0005"]
    assert not later.reset
    whole = blocks_since(conv, 0)
    assert len(whole.blocks) == 12
    assert segments(conv)[-1].start == first.total
    assert log_text(conv).count("question line-") == 6


def test_the_model_gets_history_from_rotated_segments(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(fake_ollama)
    conv = make_conv(home)
    for i in range(12):
        exchange(conv, i)
    assert len(log_segments(conv)) > 2
    (conv.inbox / "next.msg").write_text("what did I ask first?")
    rt = Runtime(settings=settings, home=home)
    asyncio.run(process_pending(rt))
    asyncio.run(rt.aclose())
    sent = fake_ollama.chat_requests()[-1]["messages"]
    user = [m["content"] for m in sent if m["role"] == "user"]
    assert user[0].startswith("question line-0000")
    assert len(user) == 13 and user[-1] == "what did I ask first?"
    assistant = [m["content"] for m in sent if m["role"] == "assistant"]
    assert len(assistant) == 12 and assistant[0].startswith("answer line-0000")


@pytest.mark.parametrize("live", ["kept", "empty", "gone"])
def test_state_rebuilt_after_rotation_counts_every_segment(home: Home, live: str) -> None:
    conv = make_conv(home)
    for i in range(20):
        exchange(conv, i)
    conv.state.unlink()
    if live == "empty":  # the segments alone hold the blocks
        conv.log.write_bytes(b"")
    elif live == "gone":
        conv.log.unlink()
    with open_writer(conv) as w:
        assert w.rebuilt
        assert w.state.messages_processed == (20 if live == "kept" else w.state.turns)
        assert w.state.turns > 0
        assert w.state.log.size == (conv.log.stat().st_size if conv.log.exists() else 0)
    assert Path(conv.log).exists() or live == "gone"
