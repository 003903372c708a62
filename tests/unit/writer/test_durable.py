"""The group committer: many conversations' durable writes made durable together, in order."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import claim, drop_message, new_conversation, open_writer
from contemplation.writer import durable as durable_mod
from contemplation.writer.durable import Durable, GroupCommitter, Steps, run_now

needs_syncfs = pytest.mark.skipif(not durable_mod.has_syncfs(), reason="syncfs is Linux only")


def _convs(home: Home, n: int) -> list[Conv]:
    tpl = load_template(home, "default")
    return [
        new_conversation(home, f"c {i}", template=tpl, model="m", backend="ollama")
        for i in range(n)
    ]


class Gate:
    """Holds the committer's thread in a first batch, so that the writes after it queue up."""

    def __init__(self) -> None:
        self.started, self.open = threading.Event(), threading.Event()

    async def hold(self, committer: GroupCommitter, done: list[str] | None = None) -> str:
        job = asyncio.ensure_future(committer.run(_gated(self, [] if done is None else done)))
        assert await asyncio.to_thread(self.started.wait, 10)  # the thread is in the batch
        return await job

    def set(self) -> None:
        self.open.set()


def _gated(gate: Gate, done: list[str], name: str = "first") -> Steps[str]:
    gate.started.set()
    gate.open.wait(10)
    yield Durable()
    done.append(name)
    return name


@needs_syncfs
def test_a_burst_is_made_durable_together_and_in_each_writes_order(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    convs = _convs(home, 6)
    events: list[str] = []
    real_syncfs, real_replace = durable_mod.syncfs, os.replace

    def syncfs(fd: int) -> None:
        events.append("syncfs")
        real_syncfs(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(f"replace {Path(dst).parent.name}")
        real_replace(src, dst)

    monkeypatch.setattr(durable_mod, "syncfs", syncfs)
    monkeypatch.setattr(os, "replace", replace)
    committer = GroupCommitter(threads=1)  # the gate holds it: the rest queue up
    gate = Gate()
    claims: list[Path] = []

    async def main() -> None:
        blocker = asyncio.ensure_future(gate.hold(committer))
        await asyncio.to_thread(gate.started.wait, 10)
        writers = []
        for i, conv in enumerate(convs):
            drop_message(conv, f"m{i}")
            w = open_writer(conv).__enter__()
            writers.append(w)
            got = claim(conv, next(iter(conv.inbox.iterdir())))
            assert got is not None
            claims.append(got)
            w.append_block("CLAUDE", "OLLAMA", f"m{i}", msg_id=got.name, claimed=got)
        runs = [asyncio.ensure_future(committer.run(w.save_steps())) for w in writers]
        await asyncio.sleep(0)
        assert events == []  # queued behind the first batch: nothing written yet
        gate.set()
        await asyncio.gather(blocker, *runs)
        for w in writers:
            w.close()

    asyncio.run(main())
    committer.close()
    # one batch of six: both points of every write made durable by one syncfs each, and no
    # state renamed in before its block and temp file are durable
    assert events[0] == "syncfs"
    assert events[1:7] == [f"replace {c.id}" for c in convs]
    assert events[7:] == ["syncfs"]
    assert committer.grouped == 2
    for conv, got in zip(convs, claims, strict=True):
        st = read_state(conv)
        assert st is not None and st.messages_processed == 1 and st.done_ids == [got.name]
        assert not got.exists()  # removed only after the state is durable


def test_one_failing_write_does_not_fail_the_others_in_its_batch(home: Home) -> None:
    convs = _convs(home, 3)
    committer = GroupCommitter(threads=1)
    gate = Gate()

    def broken() -> Steps[None]:
        yield Durable()
        raise OSError(28, "No space left on device")

    async def main() -> list[object]:
        blocker = asyncio.ensure_future(gate.hold(committer))
        await asyncio.to_thread(gate.started.wait, 10)
        writers = [open_writer(c).__enter__() for c in convs]
        for w in writers:
            w.state.turns = 7
        runs = [
            asyncio.ensure_future(committer.run(writers[0].save_steps())),
            asyncio.ensure_future(committer.run(broken())),
            asyncio.ensure_future(committer.run(writers[2].save_steps())),
        ]
        gate.set()
        got = await asyncio.gather(blocker, *runs, return_exceptions=True)
        for w in writers:
            w.close()
        return got

    got = asyncio.run(main())
    committer.close()
    assert got[0] == "first" and got[1] is None and got[3] is None
    assert isinstance(got[2], OSError) and got[2].errno == 28
    for c in (convs[0], convs[2]):
        st = read_state(c)
        assert st is not None and st.turns == 7


@needs_syncfs
def test_a_failed_syncfs_fails_every_write_waiting_on_it(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(5, "syncfs: Input/output error")

    committer = GroupCommitter(threads=1)
    gate = Gate()
    state = home.root / "s.json"
    home.root.mkdir(parents=True, exist_ok=True)

    async def main() -> list[object]:
        blocker = asyncio.ensure_future(gate.hold(committer))
        await asyncio.to_thread(gate.started.wait, 10)
        monkeypatch.setattr(durable_mod, "syncfs", failing)
        runs = [
            asyncio.ensure_future(
                committer.run(durable_mod_atomic(state.with_name(f"s{i}.json"), b"{}"))
            )
            for i in range(3)
        ]
        gate.set()
        return await asyncio.gather(blocker, *runs, return_exceptions=True)

    got = asyncio.run(main())
    committer.close()
    assert all(isinstance(g, OSError) and g.errno == 5 for g in got[1:])
    # nothing was renamed in whose temp file was not known to be durable
    assert not any(home.root.glob("s*.json"))
    assert not any(home.root.glob(".s*.json.tmp.*"))


def durable_mod_atomic(path: Path, data: bytes) -> Steps[None]:
    from contemplation.writer.files import atomic_write_steps

    return atomic_write_steps(path, data)


def test_a_write_does_not_wait_behind_another_conversations_slow_one(tmp_path: Path) -> None:
    """Two threads: the next turn's first write (on its request's critical path) is not
    queued behind the last turn's commit."""
    committer = GroupCommitter()
    gate = Gate()

    async def main() -> None:
        slow = asyncio.ensure_future(gate.hold(committer))
        await asyncio.to_thread(gate.started.wait, 10)
        await asyncio.wait_for(committer.run(durable_mod_atomic(tmp_path / "f", b"{}")), 10)
        assert not slow.done()  # the first is still held while the second is durable
        gate.set()
        assert await slow == "first"

    asyncio.run(main())
    committer.close()
    assert (tmp_path / "f").read_bytes() == b"{}"


def test_a_queued_write_can_be_withdrawn_and_a_begun_one_cannot(tmp_path: Path) -> None:
    """withdraw(): a write no thread has taken never runs and its run() returns None; one a
    thread has taken runs to its end."""
    committer = GroupCommitter(threads=1)
    gate = Gate()
    ran: list[str] = []

    def steps(name: str) -> Steps[str]:
        ran.append(name)
        yield Durable()
        return name

    async def main() -> None:
        first_steps = _gated(gate, ran, "first")
        first = asyncio.ensure_future(committer.run(first_steps))
        assert await asyncio.to_thread(gate.started.wait, 10)  # the one thread is in it
        queued = steps("queued")
        waiting = asyncio.ensure_future(committer.run(queued))
        kept = asyncio.ensure_future(committer.run(steps("kept")))
        await asyncio.sleep(0)  # both are queued behind the held batch
        assert committer.withdraw(queued) is True
        assert committer.withdraw(queued) is False  # only once
        assert committer.withdraw(first_steps) is False  # begun: it runs to its end
        assert await asyncio.wait_for(waiting, 10) is None
        gate.set()
        assert await first == "first"
        assert await asyncio.wait_for(kept, 10) == "kept"

    asyncio.run(main())
    committer.close()
    assert ran == ["first", "kept"]  # the withdrawn write's steps never began


def test_a_cancel_waits_for_the_write_to_end() -> None:
    committer = GroupCommitter()
    gate = Gate()
    done: list[str] = []

    async def main() -> None:
        task = asyncio.ensure_future(committer.run(_gated(gate, done, "w")))
        assert await asyncio.to_thread(gate.started.wait, 10)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting: the write runs to its end first
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done == ["w"]

    asyncio.run(main())
    committer.close()


def test_one_committer_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    committer = GroupCommitter()
    for i in range(3):  # asyncio.run makes a new loop each time
        path = tmp_path / f"f{i}.json"
        asyncio.run(committer.run(durable_mod_atomic(path, json.dumps({"i": i}).encode())))
        assert json.loads(path.read_text()) == {"i": i}
    committer.close()


def test_run_now_makes_each_point_durable_before_going_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        events.append("fsync")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    f = tmp_path / "f"
    f.write_bytes(b"x")

    def steps() -> Steps[int]:
        events.append("a")
        yield Durable(files=(f,), folders=(tmp_path,))
        events.append("b")
        return 3

    assert run_now(steps()) == 3
    assert events == ["a", "fsync", "fsync", "b"]


@needs_syncfs
def test_points_that_name_their_file_system_are_not_stated_item_by_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a burst every write names its folder's file system: one syncfs for all of them and
    no stat of each file; a point that does not name it is stat'ed as before."""
    calls: list[str] = []
    real_stat, real_fstat, real_syncfs = os.stat, os.fstat, durable_mod.syncfs

    def stat(path: object, *args: object, **kw: object) -> os.stat_result:
        calls.append("stat")
        return real_stat(path, *args, **kw)  # type: ignore[arg-type]

    def fstat(fd: int) -> os.stat_result:
        calls.append("fstat")
        return real_fstat(fd)

    def syncfs(fd: int) -> None:
        calls.append("syncfs")
        real_syncfs(fd)

    files = [tmp_path / f"f{i}" for i in range(5)]
    for f in files:
        f.write_bytes(b"x")
    dev = real_stat(tmp_path).st_dev
    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "fstat", fstat)
    monkeypatch.setattr(durable_mod, "syncfs", syncfs)
    named = [Durable(files=(f,), folders=(tmp_path,), dev=dev) for f in files]
    durable_mod._syncfs_points(named)
    assert calls == ["syncfs"]
    calls.clear()
    durable_mod._syncfs_points([Durable(files=(f,)) for f in files])
    assert calls == ["stat", "syncfs", "stat", "stat", "stat", "stat"]
