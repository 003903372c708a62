"""The floor under a turn. Run: .venv/bin/python bench/bench_floor.py [--convs N]

Only the file operations the on-disk contract makes one turn do, in plain Python on one
thread, with none of contemplation's code: no parse, no prompt, no event loop, no lock, no
second thread. Whatever this prints is more than any daemon built on that contract can reach
on this machine and file system; the in-process target (>= 1,000 turns/s with 1,000
conversations, durability = fsync) is measured against it.

A turn here, in each of N fresh conversation folders holding one message:

  claim      rename inbox/<msg> -> processing/<msg>
  read       open, read and close the claimed file
  append     open messages.log (append), write the agent's block
  state      state.json by temp file + rename: once or twice a turn (``--writes``)
  reply      write the model's block
  unlink     remove the claimed file (its block is committed)

Durability, three ways:
  none       no fsync at all: the bare cost of the names and bytes
  syncfs/64  one syncfs per 64 turns (the group committer's best case: one journal commit
             shared by 64 conversations, each write's order kept by running the 64 turns'
             steps round by round)
  fsync      each turn on its own: fsync of the log and the temp file, then of the folder

``--threads K``: the syncfs/64 way on K threads, each with its share of the conversations
(the daemon's file work runs on its event loop and two committer threads).

Prints turns/s and the time per operation (µs, mean and p99), best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


STATE = json.dumps({"version": 1, "status": "idle", "log": {"ino": 0, "size": 0}}, indent=2)
BLOCK = b"=== CLAUDE -> OLLAMA [2026-11-24T00:00:00] ===\nmessage %d\n"
REPLY = b"\n=== OLLAMA -> CLAUDE [2026-11-24T00:00:00] ===\nok\n"


class Timer:
    """Time per named operation, in nanoseconds."""

    def __init__(self) -> None:
        self.ns: dict[str, list[int]] = defaultdict(list)

    def run(self, name: str, fn: Callable[[], object]) -> None:
        t = time.perf_counter_ns()
        fn()
        self.ns[name].append(time.perf_counter_ns() - t)


def make_home(n: int) -> Path:
    root = Path(tempfile.mkdtemp(prefix="floor-"))
    for i in range(n):
        d = root / f"conv_{i:05d}"
        (d / "inbox").mkdir(parents=True)
        (d / "processing").mkdir()
        (d / "metadata.json").write_text('{"id": "x"}\n')
        (d / "state.json").write_text(STATE)
        (d / "messages.log").touch()
        (d / "inbox" / "m.msg").write_bytes(b"message %d\n" % i)
    os.sync()  # the set-up's own writes are not the turn's
    return root


class Turn:
    """One conversation's turn as steps; ``yield`` marks where a durable point would be."""

    def __init__(self, d: Path, i: int, writes: int, t: Timer) -> None:
        self.d, self.i, self.writes, self.t = d, i, writes, t
        self.fd = -1
        self.seq = 0

    def _state(self) -> list[int]:
        """Write the temp file; returns its descriptor (closed after its point)."""
        self.seq += 1
        tmp = self.d / f".state.json.tmp.{self.seq}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        os.write(fd, STATE.encode())
        return [fd]

    def _rename(self, fds: list[int]) -> None:
        os.close(fds[0])
        os.replace(self.d / f".state.json.tmp.{self.seq}", self.d / "state.json")

    def steps(self) -> Iterator[tuple[object, ...]]:
        """The turn's file work; each item is a point made durable before it goes on."""
        d, t = self.d, self.t
        src, dst = d / "inbox" / "m.msg", d / "processing" / "m.msg"
        t.run("claim", lambda: os.rename(src, dst))

        def read() -> None:
            fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            os.read(fd, 1 << 16)
            os.close(fd)

        t.run("read", read)

        def append() -> None:
            self.fd = os.open(d / "messages.log", os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            os.write(self.fd, BLOCK % self.i)

        t.run("append", append)
        if self.writes == 2:
            fds: list[int] = []
            t.run("state tmp", lambda: fds.extend(self._state()))
            yield (self.fd, fds[0])  # the block and the temp file
            t.run("state rename", lambda: self._rename(fds))
            yield ("dir",)
        t.run("reply", lambda: os.write(self.fd, REPLY))
        fds2: list[int] = []
        t.run("state tmp", lambda: fds2.extend(self._state()))
        yield (self.fd, fds2[0])
        t.run("state rename", lambda: self._rename(fds2))
        yield ("dir",)
        t.run("unlink", lambda: os.unlink(dst))
        os.close(self.fd)


def fsync_point(d: Path, point: tuple[object, ...]) -> None:
    if point == ("dir",):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        return
    for fd in point:
        assert isinstance(fd, int)
        os.fsync(fd)


def _grouped(dirs: list[tuple[int, Path]], writes: int, t: Timer, group: int) -> None:
    """Turns in groups of ``group``, their steps run round by round, one syncfs per round."""
    anchor = os.open(dirs[0][1].parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for start in range(0, len(dirs), group):
            live = [iter(Turn(d, i, writes, t).steps()) for i, d in dirs[start : start + group]]
            while live:
                live = [steps for steps in live if next(steps, None) is not None]
                if live:
                    t.run("syncfs (per round)", lambda: syncfs(anchor))
    finally:
        os.close(anchor)


def run(n: int, writes: int, durability: str, threads: int = 1) -> tuple[float, Timer]:
    root = make_home(n)
    dirs = list(enumerate(sorted(root.iterdir())))
    timers = [Timer() for _ in range(threads)]
    t0 = time.perf_counter()
    if durability == "syncfs":  # each thread its share of the conversations
        workers = [
            threading.Thread(target=_grouped, args=(dirs[k::threads], writes, timers[k], 64))
            for k in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    else:
        t = timers[0]
        for i, d in dirs:
            for point in Turn(d, i, writes, t).steps():
                if durability == "fsync":
                    t.run("fsync point", lambda d=d, p=point: fsync_point(d, p))  # type: ignore[misc]
    dt = time.perf_counter() - t0
    shutil.rmtree(root)
    merged = Timer()
    for t in timers:
        for name, ns in t.ns.items():
            merged.ns[name].extend(ns)
    return n / dt, merged


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--convs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--durability", choices=["none", "syncfs", "fsync", "all"], default="all")
    ap.add_argument(
        "--threads", type=int, default=1, help="syncfs/64 only: threads sharing the turns"
    )
    args = ap.parse_args()
    ways = ["none", "syncfs", "fsync"] if args.durability == "all" else [args.durability]
    print(
        f"{args.convs} conversations, one turn each, no contemplation code (best of {args.rounds})"
    )
    for durability in ways:
        for writes in (2, 1):
            best, timer = 0.0, Timer()
            for _ in range(args.rounds):
                rate, t = run(
                    args.convs, writes, durability, args.threads if durability == "syncfs" else 1
                )
                if rate > best:
                    best, timer = rate, t
            label = "syncfs/64" if durability == "syncfs" else durability
            if durability == "syncfs" and args.threads > 1:
                label += f" on {args.threads} threads"
            print(f"\n  durability {label:<9} state writes per turn {writes}: {best:7.0f} turns/s")
            for name, ns in timer.ns.items():
                per = len(ns) / args.convs
                p99 = sorted(ns)[int(0.99 * (len(ns) - 1))] / 1e3
                print(
                    f"    {name:<20} {per:5.2f}/turn  mean {statistics.fmean(ns) / 1e3:7.1f} µs"
                    f"  p99 {p99:8.1f} µs  = {sum(ns) / 1e6 / args.convs:6.3f} ms/turn"
                )


if __name__ == "__main__":
    main()
