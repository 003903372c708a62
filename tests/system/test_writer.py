"""The writer: atomic state, exactly-once appends, recovery of every torn state, locks."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import subprocess
import threading
from pathlib import Path

import pytest

from contemplation.errors import AlreadyRunning, InputRejected
from contemplation.models import Intent, MarkerKind, Metadata, Status
from contemplation.protocol import logformat
from contemplation.protocol.parser import parse
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import (
    ConvWriter,
    DaemonLock,
    ReplyStream,
    atomic_write_json,
    claim,
    conv_lock,
    daemon_alive,
    drop_message,
    new_conversation,
    open_writer,
)
from contemplation.writer.durable import Steps
from contemplation.writer.recovery import recover
from tests.peers import executable


def conv_in(home: Home) -> Conv:
    return new_conversation(
        home, "t", template=load_template(home, "default"), model="m", backend="ollama"
    )


def _hammer(path: str, n: int) -> None:
    for i in range(n):
        atomic_write_json(Path(path), {"i": i, "pad": "x" * 50_000})


def test_atomic_json_is_never_seen_half_written(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_write_json(target, {"i": -1})
    p = multiprocessing.get_context("spawn").Process(target=_hammer, args=(str(target), 300))
    p.start()
    reads = 0
    while p.is_alive() or reads < 10:
        json.loads(target.read_bytes())  # raises on a torn file
        reads += 1
    p.join()
    assert p.exitcode == 0 and reads > 10
    assert not list(tmp_path.glob(".*.tmp.*"))


def test_claim_is_won_by_exactly_one_of_many(home: Home) -> None:
    """Claims are made under the conversation's lock (the daemon's writer holds it), and a
    claim's inbox name is gone before the lock is let go: a claim that has linked the file
    into processing/ has won (a withdraw then leaves it), so the lock, not the inbox name,
    is what one claimer holds against another."""
    conv = conv_in(home)
    path = drop_message(conv, "x")
    wins: list[Path] = []
    barrier = threading.Barrier(8)

    def racer() -> None:
        barrier.wait()
        with conv_lock(conv):
            got = claim(conv, path)
        if got is not None:
            wins.append(got)

    ts = [threading.Thread(target=racer) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(wins) == 1 and wins[0].read_text() == "x"


def test_append_is_exactly_once_by_id(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        assert w.append_block("CLAUDE", "OLLAMA", "hi", msg_id="m1") == 0
        assert w.append_block("CLAUDE", "OLLAMA", "hi", msg_id="m1") == -1
    assert len(parse(conv.log.read_bytes()).blocks) == 1


def _intent_for(conv: Conv, data: bytes, offset: int, msg_id: str = "m9") -> None:
    with open_writer(conv) as w:
        w.state.intent = Intent(
            kind="message",
            id=msg_id,
            offset=offset,
            length=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        w.save()


def test_recovery_rolls_a_complete_append_forward(home: Home) -> None:
    conv = conv_in(home)
    data = (logformat.header("CLAUDE", "OLLAMA") + "whole\n").encode()
    _intent_for(conv, data, 0)
    with open(conv.log, "ab") as f:
        f.write(data)
    (conv.processing).mkdir(exist_ok=True)
    (conv.processing / "m9").write_text("whole")
    with open_writer(conv) as w:
        done = recover(w)
    st = read_state(conv)
    assert st is not None and st.intent is None and "m9" in st.done_ids and st.log.size == len(data)
    assert not (conv.processing / "m9").exists()
    assert any("committed" in d for d in done)


def test_recovery_rolls_a_torn_append_back_and_keeps_the_message(home: Home) -> None:
    conv = conv_in(home)
    data = (logformat.header("CLAUDE", "OLLAMA") + "x" * 1000 + "\n").encode()
    _intent_for(conv, data, 0)
    with open(conv.log, "ab") as f:
        f.write(data[:300])
    conv.processing.mkdir(exist_ok=True)
    (conv.processing / "m9").write_text("x" * 1000)
    with open_writer(conv) as w:
        recover(w)
    assert conv.log.read_bytes() == b""
    st = read_state(conv)
    assert st is not None and st.intent is None and "m9" not in st.done_ids
    assert (conv.processing / "m9").exists()  # still queued


def test_recovery_never_truncates_bytes_it_cannot_prove_are_its_own(home: Home) -> None:
    conv = conv_in(home)
    data = (logformat.header("CLAUDE", "OLLAMA") + "mine\n").encode()
    _intent_for(conv, data, 0)
    foreign = b"someone else's text that is long enough to pass the end\n" * 3
    with open(conv.log, "ab") as f:
        f.write(foreign)
    with open_writer(conv) as w:
        recover(w)
    assert conv.log.read_bytes() == foreign


def test_recovery_marks_a_cut_off_reply_interrupted(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "q", msg_id="a")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content("half an ans")
        # the process "dies" here: no finish(), the intent stays in state.json
    with open_writer(conv) as w:
        recover(w)
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].interrupted and blocks[-1].text == "half an ans"
    assert (MarkerKind.INTERRUPTED, "reply cut off by a restart; it will be redone") in blocks[
        -1
    ].markers
    st = read_state(conv)
    assert st is not None and st.intent is None and st.log.size == conv.log.stat().st_size


def test_a_reserved_reply_intent_rides_on_the_turns_state_write(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contemplation.writer import session

    conv = conv_in(home)
    writes: list[object] = []
    real = session.atomic_write_steps

    def record(path: Path, data: bytes, **kw: bool) -> Steps[None]:
        writes.append((json.loads(data)["intent"] or {}).get("kind"))
        return real(path, data, **kw)

    monkeypatch.setattr(session, "atomic_write_steps", record)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "q", msg_id="a")
        writes.clear()
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        assert r.reserve() and not r.reserved  # not durable yet: begin() would journal
        w.save()  # the turn's first state write (status generating)
        assert writes == ["reply"] and r.reserved
        r.content("an answer")
        assert writes == ["reply"]  # the first text wrote no state of its own
        r.finish()
    assert writes == ["reply", None]
    assert parse(conv.log.read_bytes()).blocks[-1].text.strip() == "an answer"


def _reserved_reply(w: ConvWriter) -> ReplyStream:
    """A question in the log, and a reply whose intent the turn's first state write carried."""
    w.append_block("CLAUDE", "OLLAMA", "q", msg_id="a")
    r = w.reply("OLLAMA", "CLAUDE", "r1")
    r.reserve()
    w.save()
    return r


def test_a_reserved_reply_that_never_began_leaves_no_marker(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        _reserved_reply(w)
        # the process "dies" during the request: no text, the intent stays in state.json
    size = conv.log.stat().st_size
    with open_writer(conv) as w:
        recover(w)
    assert conv.log.stat().st_size == size  # nothing to mark: the reply wrote nothing
    st = read_state(conv)
    assert st is not None and st.intent is None


def test_an_unbegun_reply_takes_its_reservation_back_before_a_marker(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        r = _reserved_reply(w)
        r.unreserve()  # the request failed before any text
        st = read_state(conv)
        assert st is not None and st.intent is None  # durable before the ERROR marker
        w.append_marker(MarkerKind.ERROR, "the server said no")
    with open_writer(conv) as w:  # a restart finds no reply to mark interrupted
        assert recover(w) == []
    assert not parse(conv.log.read_bytes()).blocks[-1].interrupted


def test_a_reply_begun_after_the_log_moved_journals_its_own_intent(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        r = _reserved_reply(w)
        r.note("a fallback backend answers")  # a NOTE block before the reply's header
        assert not r.reserved
        moved = conv.log.stat().st_size
        r.content("half")
        st = read_state(conv)
        assert st is not None and st.intent is not None and st.intent.offset == moved
    with open_writer(conv) as w:
        recover(w)  # cut off: the reply (not the NOTE) is marked
    blocks = parse(conv.log.read_bytes()).blocks
    assert blocks[-1].interrupted and blocks[-1].text.strip() == "half"


def test_state_is_rebuilt_from_the_log_and_inputs_already_in_it_are_not_redone(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "already here", msg_id="x1")
        r = w.reply("OLLAMA", "CLAUDE", "r")
        r.content("answer")
        r.finish()
    conv.processing.mkdir(exist_ok=True)
    (conv.processing / "x1").write_text("already here\n")
    (conv.processing / "x2").write_text("new one")
    conv.state.write_text('{"seq":')  # corrupt
    with open_writer(conv) as w:
        assert w.rebuilt
        recover(w)
        assert w.state.turns == 1 and w.state.messages_processed == 1
    assert not (conv.processing / "x1").exists()
    assert (conv.processing / "x2").exists()


def test_flocked_hand_appends_never_interleave_with_daemon_appends(home: Home) -> None:
    """The documented way to append by hand: flock <conv>/.lock -c 'cat >> messages.log'."""
    flock = executable("flock")
    conv = conv_in(home)
    big = conv.dir.parent.parent / "big.txt"
    big.write_text(("y" * 299 + "\n") * 1000)  # 300 KB: cat writes it in several write() calls
    script = conv.dir.parent.parent / "append.sh"
    script.write_text(
        f'for i in $(seq 5); do {flock} "{conv.lock}" -c '
        f'\'printf "\\n=== CLAUDE -> OLLAMA [2026-01-01 00:00:00] ===\\n" >> "{conv.log}"; cat "{big}" >> "{conv.log}"\'; done\n'
    )
    proc = subprocess.Popen(["bash", str(script)])
    for i in range(40):
        with open_writer(conv) as w:
            w.adopt_foreign()
            w.append_block("OLLAMA", "CLAUDE", ("z" * 99 + "\n") * 100, msg_id=f"d{i}")
    assert proc.wait(60) == 0
    blocks = parse(conv.log.read_bytes()).blocks
    assert len(blocks) == 45
    for b in blocks:
        chars = set(b.text.replace("\n", ""))
        assert len(chars) == 1, "a block holds bytes of two writers"


def test_a_second_daemon_lock_on_one_home_refuses_clearly(home: Home) -> None:
    first = DaemonLock(home)
    first.acquire()
    try:
        assert daemon_alive(home)
        with pytest.raises(AlreadyRunning, match="already running"):
            DaemonLock(home).acquire()
    finally:
        first.release()
    assert not daemon_alive(home)


def test_the_log_is_never_opened_through_a_symlink(home: Home, tmp_path: Path) -> None:
    conv = conv_in(home)
    outside = tmp_path / "outside.txt"
    outside.write_text("do not touch\n")
    conv.log.unlink()
    os.symlink(outside, conv.log)
    with pytest.raises(InputRejected, match="not a regular file"), open_writer(conv) as w:
        w.check_identity()
    with pytest.raises(OSError), open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "hi", msg_id="s")
    assert outside.read_text() == "do not touch\n"


# ----------------------------------------------------- claimed messages (no intent journaled)


def _claimed(conv: Conv, name: str, text: str) -> Path:
    conv.processing.mkdir(exist_ok=True)
    path = conv.processing / name
    path.write_text(text)
    return path


def test_a_claimed_message_is_fsynced_committed_and_removed_by_the_next_state_write(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contemplation.writer import session

    conv = conv_in(home)
    claimed = _claimed(conv, "m1", "hello")
    events: list[str] = []
    real_write, real_fsync = session.atomic_write_steps, os.fsync

    def record(path: Path, data: bytes, **kw: bool) -> Steps[None]:
        events.append(f"state file_kept={claimed.exists()} done={json.loads(data)['done_ids']}")
        return real_write(path, data, **kw)

    def fsync(fd: int) -> None:
        if os.path.samestat(os.fstat(fd), conv.log.stat()):
            events.append("fsync log")
        real_fsync(fd)

    monkeypatch.setattr(session, "atomic_write_steps", record)
    monkeypatch.setattr(os, "fsync", fsync)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "hello", msg_id="m1", claimed=claimed)
        # no intent write, no fsync yet: both wait for the next state write (the turn's)
        assert events == [] and claimed.exists()
        w.flush()
        assert not claimed.exists()  # removed only once the block is durable and committed
    assert events == ["fsync log", "state file_kept=True done=['m1']"]
    assert parse(conv.log.read_bytes()).blocks[-1].text.strip() == "hello"


@pytest.mark.parametrize("durable_save", [False, True])
def test_a_folder_made_by_hand_is_durable_before_its_first_message_is_removed(
    home: Home, monkeypatch: pytest.MonkeyPatch, durable_save: bool
) -> None:
    """A bare ``inbox/`` gets its log and its state (the log's size before any append) at
    first sight, and its metadata from the writer's first save, which makes the folder (the
    new log's name) durable before the claimed file goes (a power loss before it finds the
    file again, never a lost message)."""
    conv = Conv(home.active / "by-hand")
    conv.inbox.mkdir(parents=True)
    meta = Metadata(id=conv.id, topic="by hand", created="x", backend="ollama", model="m")
    events: list[str] = []
    real_fsync, real_unlink = os.fsync, os.unlink

    def fsync(fd: int) -> None:
        if os.path.samestat(os.fstat(fd), conv.dir.stat()):
            events.append("fsync folder")
        real_fsync(fd)

    def unlink(path: str | Path, *args: object, **kw: object) -> None:
        events.append(f"unlink {Path(path).name}")
        real_unlink(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    with open_writer(conv, default_meta=meta) as w:
        assert conv.log.exists() and conv.processing.is_dir()
        assert not conv.metadata.exists()  # left for the first save
        assert json.loads(conv.state.read_text())["log"]["size"] == 0
        claimed = _claimed(conv, "m1", "hello")
        w.append_block("CLAUDE", "OLLAMA", "hello", msg_id="m1", claimed=claimed)
        if durable_save:  # the turn's start write: the state's rename makes the folder durable
            w.save()
        else:  # the session's end: the held block's point does
            w.flush()
    assert events.index("fsync folder") < events.index("unlink m1")
    assert events.count("fsync folder") == 1  # once, not with every save
    with open_writer(conv) as w:  # the metadata was written: no default needed any more
        assert w.meta.topic == "by hand" and w.state.done_ids == ["m1"]
        w.set_status(Status.IDLE)
    assert events.count("fsync folder") == 2  # the state's own rename, not the adoption


@pytest.mark.parametrize("late", [0, 1])
def test_recovery_commits_a_whole_claimed_block_whatever_the_header_time(
    home: Home, late: int
) -> None:
    conv = conv_in(home)
    claimed = _claimed(conv, "00-m1", "the question\nin two lines")
    with open_writer(conv) as w:
        ts = logformat.timestamp() if not late else "1999-01-01 00:00:00"
        data = w.block_bytes("CLAUDE", "OLLAMA", "the question\nin two lines", 0, ts=ts)
    with open(conv.log, "ab") as f:
        f.write(data)
    with open_writer(conv) as w:
        done = recover(w)
    st = read_state(conv)
    assert st is not None and st.log.size == len(data) and "00-m1" in st.done_ids
    assert not claimed.exists()
    assert done == [
        "committed message 00-m1 found whole in the log",
        "removed 00-m1 (already in the log)",
    ] or any("committed message 00-m1" in d for d in done)


def test_recovery_cuts_a_torn_claimed_block_and_keeps_the_file(home: Home) -> None:
    conv = conv_in(home)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "first", msg_id="a")
        start = w.state.log.size
        data = w.block_bytes("CLAUDE", "OLLAMA", "y" * 2000, start)
    claimed = _claimed(conv, "01-m2", "y" * 2000)
    for cut in (3, 30, len(data) // 2, len(data) - 1):  # inside the separator, the time, the body
        with open(conv.log, "ab") as f:
            f.write(data[:cut])
        with open_writer(conv) as w:
            done = recover(w)
        assert conv.log.stat().st_size == start, cut
        assert any("rolled back a torn append of 01-m2" in d for d in done)
        assert claimed.exists()


def test_recovery_leaves_bytes_that_are_not_the_claimed_block(home: Home) -> None:
    conv = conv_in(home)
    claimed = _claimed(conv, "00-m1", "what I asked")
    by_hand = b"=== CLAUDE -> OLLAMA [2026-01-01 00:00:00] ===\nsomething else entirely\n"
    with open(conv.log, "ab") as f:
        f.write(by_hand)
    with open_writer(conv) as w:
        assert recover(w) == []
    assert conv.log.read_bytes() == by_hand  # left for adoption as a hand append
    assert claimed.exists()


@pytest.mark.parametrize("cut", ["none", "header", "half", "whole"])
def test_recovery_marks_an_unjournaled_reply_after_a_claimed_block_interrupted(
    home: Home, cut: str
) -> None:
    """A crash in a turn whose reply was begun without a journaled intent (its start write
    withdrawn, the commit to do both): the claimed block is committed once, the reply's
    bytes (any prefix of them) are marked INTERRUPTED, the claimed file goes."""
    conv = conv_in(home)
    claimed = _claimed(conv, "00-m1", "hello")
    before = read_state(conv)
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "hello", msg_id=claimed.name, claimed=claimed)
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        assert r.reserve() and r.merge_into_commit(lambda: True)
        end_of_block = w.log_size()
        if cut != "none":
            r.content("an answer that is whole" if cut == "whole" else "half an ans")
        # the process "dies" here: no state write at all since the turn began
    assert read_state(conv) == before and claimed.exists()
    if cut == "header":  # torn inside the reply's header
        with open(conv.log, "r+b") as f:
            f.truncate(end_of_block + 8)
    with open_writer(conv) as w:
        done = recover(w)
    blocks = parse(conv.log.read_bytes()).blocks
    assert [b.text.strip() for b in blocks if b.kind.value == "agent"] == ["hello"]
    assert not claimed.exists()
    st = read_state(conv)
    assert st is not None and st.intent is None and st.log.size == conv.log.stat().st_size
    assert "00-m1" in st.done_ids
    if cut in ("none", "header"):  # nothing, or a torn header (cut away): nothing to mark
        assert conv.log.stat().st_size == end_of_block
        assert not any("interrupted" in d for d in done)
        assert (cut == "header") == any("rolled back the torn start of a reply" in d for d in done)
    else:
        assert any("marked the interrupted reply" in d for d in done)
        assert blocks[-1].interrupted or blocks[-1].markers[-1][0] is MarkerKind.INTERRUPTED


def test_a_reply_begins_unjournaled_only_right_after_an_uncommitted_claimed_block(
    home: Home,
) -> None:
    conv = conv_in(home)
    called: list[str] = []

    def withdraw() -> bool:
        called.append("withdraw")
        return True

    with open_writer(conv) as w:  # no claimed block: the intent must be journaled
        w.append_block("CLAUDE", "OLLAMA", "q", msg_id="a")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        assert r.reserve() and not r.merge_into_commit(withdraw)
    claimed = _claimed(conv, "01-m2", "hello")
    with open_writer(conv) as w:  # a NOTE after the claimed block: saved, and the log moved
        w.append_block("CLAUDE", "OLLAMA", "hello", msg_id=claimed.name, claimed=claimed)
        w.append_marker(MarkerKind.NOTE, "a note")
        r = w.reply("OLLAMA", "CLAUDE", "r2")
        assert r.reserve() and not r.merge_into_commit(withdraw)
    assert called == []  # never asked to withdraw the write: nothing changed
    claimed = _claimed(conv, "02-m3", "again")
    with open_writer(conv) as w:  # the write had begun: the reply journals as before
        w.append_block("CLAUDE", "OLLAMA", "again", msg_id=claimed.name, claimed=claimed)
        r = w.reply("OLLAMA", "CLAUDE", "r3")
        assert r.reserve() and not r.merge_into_commit(lambda: False)
        assert not r.reserved


def test_recovery_leaves_a_hand_block_after_an_uncommitted_claimed_block(home: Home) -> None:
    """Only the model's header marks a reply; the agent's own block written by hand after
    an uncommitted claimed block is left for adoption."""
    conv = conv_in(home)
    claimed = _claimed(conv, "00-m1", "hello")
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "hello", msg_id=claimed.name, claimed=claimed)
        end_of_block = w.log_size()
    by_hand = b"\n=== CLAUDE -> OLLAMA [2026-01-01 00:00:00] ===\nmore from me\n"
    with open(conv.log, "ab") as f:
        f.write(by_hand)
    with open_writer(conv) as w:
        done = recover(w)
    assert not any("interrupted" in d for d in done)
    assert conv.log.read_bytes()[end_of_block:] == by_hand
    st = read_state(conv)
    assert st is not None and st.log.size == end_of_block  # the hand block: still to adopt


def test_a_forked_child_names_its_temp_files_with_its_own_pid(tmp_path: Path) -> None:
    """A temp file is stale only once the process in its name is gone: a forked child must
    not write its temp files under its parent's pid."""
    from contemplation.writer.files import atomic_write_steps

    pid = os.fork()
    if pid == 0:  # the child: write up to the temp file's durable point, then look at it
        steps = atomic_write_steps(tmp_path / "state.json", b"{}")
        next(steps)
        names = [p.name for p in tmp_path.iterdir()]
        os._exit(0 if any(f".tmp.{os.getpid()}." in n for n in names) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
