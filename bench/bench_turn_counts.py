"""What one turn costs in file-system operations. Run: .venv/bin/python bench/bench_turn_counts.py

N conversations x 1 message through process_pending with an instant in-process backend,
durability = fsync. Every os.replace of state.json, fsync, flock, open of messages.log and
listing of a folder is counted, then divided by N, and printed with what each is for.

``--hand``: the folders are made by hand (only ``inbox/<file>``), so each turn also pays for
the conversation's first sight (its metadata, state, log and ``processing/`` are made).

``--syscalls``: also every system call of the burst (all threads), counted by ``strace -f -c``
attached to this process once the conversations are made (needs strace: apt install strace).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_foundation import InstantBackend  # noqa: E402
from contemplation import backends  # noqa: E402
from contemplation.daemon.root import build_runtime  # noqa: E402
from contemplation.engine.pipeline import process_pending  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import (  # noqa: E402
    drop_message,
    durable,
    new_conversation,
)

WHAT = {
    "state writes": "the turn's start (status generating, carrying the message's commit and "
    "the reply's intent, its offset before its first byte) and the reply's commit with its "
    "status; one when the whole reply is in before the committer has begun the start write "
    "(taken back: the commit does its work)",
    "fsyncs": "alone (a write that is the only one in its batch): the message block with the "
    "start's temp file, then its folder; the commit's temp file and its folder, then the "
    "reply block (its last bytes written between), then the folder. In a burst none: the "
    "group committer makes each round of a batch durable with one syncfs",
    "syncfs": "one per round of a group commit (two rounds per batch of writes: the blocks "
    "and temp files, then the renames; a reply's commit three: its temp file by name first), "
    "shared by every conversation in the batch",
    "locks": "flock of <conv>/.lock, one per process(): the step that takes the message, its "
    "turn and the step after it that finds nothing due run under one hold",
    "log opens": "the first read of the parse at first sight, and one read-write descriptor "
    "for the session's appends, the reply's text and the separator check, which every later "
    "refresh of the parse reads through (the message, then the reply)",
    "listings": "at first sight the conversation's folder (stale temp files, the log's "
    "segments) and processing/ (claimed messages), once per session each; inbox/ before the "
    "message is taken and after the turn (a message that came meanwhile); home/active once "
    "per burst",
    "metadata writes": "by hand only: the defaults, written by the first state write",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", type=int, default=200)
    ap.add_argument("--syscalls", action="store_true", help="count every system call (strace)")
    ap.add_argument("--hand", action="store_true", help="folders made by hand")
    args = ap.parse_args()
    if args.syscalls and shutil.which("strace") is None:
        raise SystemExit("--syscalls needs strace (apt install strace)")
    for parallel in (1, 256):
        count(args.convs, parallel, syscalls=args.syscalls, by_hand=args.hand)


@contextlib.contextmanager
def strace_counts(n: int) -> Iterator[None]:
    """Count this process's system calls (every thread) while the block runs; print them
    per turn, futex apart (the threads' hand-offs), the nine most frequent by name."""
    out = Path(tempfile.mkdtemp()) / "strace.txt"
    tracer = subprocess.Popen(
        [shutil.which("strace") or "strace", "-f", "-c", "-o", str(out), "-p", str(os.getpid())],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while "TracerPid:\t0" in Path("/proc/self/status").read_text():
        if time.monotonic() > deadline:
            tracer.kill()
            raise SystemExit("strace did not attach (is ptrace allowed here?)")
        time.sleep(0.01)
    try:
        yield
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    calls: dict[str, int] = {}
    for line in out.read_text().splitlines():
        cols = line.split()
        if len(cols) >= 5 and cols[3].isdigit() and cols[-1] != "total":
            calls[cols[-1]] = int(cols[3])
    futex = calls.pop("futex", 0)
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:9]
    print(
        f"  syscalls     {sum(calls.values()) / n:6.1f}   all but futex ({futex / n:.1f} futex): "
        + ", ".join(f"{name} {k / n:.1f}" for name, k in top)
    )


def count(n: int, parallel: int, *, syscalls: bool = False, by_hand: bool = False) -> None:
    backends.register("instant", lambda s: InstantBackend())
    home = Home(Path(tempfile.mkdtemp()) / "home")
    tpl = load_template(home, "default")
    for i in range(n):
        if by_hand:
            inbox = home.active / f"hand-{i:05d}" / "inbox"
            inbox.mkdir(parents=True)
            (inbox / "q.txt").write_text(f"message {i}\n")
            continue
        conv = new_conversation(home, f"c {i}", template=tpl, model="m", backend="instant")
        drop_message(conv, f"message {i}")
    overrides = {"settle_seconds": 0, "log_level": "warning"}
    if by_hand:
        overrides.update(default_backend="instant", default_model="m")
    settings = load(home=home.root, env={}, config=None, overrides=overrides)
    rt = build_runtime(settings)  # as the daemon starts: checked, aiohttp imported
    counts: Counter[str] = Counter()

    wrapped: list[tuple[Any, str, Any]] = []

    def wrap(mod: Any, name: str, key: Callable[..., str | None]) -> None:
        real = getattr(mod, name)
        wrapped.append((mod, name, real))

        def counted(*a: Any, **kw: Any) -> Any:
            k = key(*a, **kw)
            if k:
                counts[k] += 1
            return real(*a, **kw)

        setattr(mod, name, counted)

    wrap(
        os,
        "replace",
        lambda src, dst, **_: (
            "state writes"
            if str(dst).endswith("state.json")
            else "metadata writes"
            if str(dst).endswith("metadata.json")
            else None
        ),
    )
    wrap(os, "listdir", lambda path=".": "listings")
    wrap(os, "scandir", lambda path=".": "listings")
    wrap(os, "fsync", lambda fd: "fsyncs")
    wrap(durable, "syncfs", lambda fd: "syncfs")
    wrap(fcntl, "flock", lambda fd, op: "locks" if op & fcntl.LOCK_EX else None)
    wrap(
        os,
        "open",
        lambda path, *a, **kw: "log opens" if str(path).endswith("messages.log") else None,
    )
    how = "one at a time" if parallel == 1 else f"{parallel} at once"
    traced = strace_counts(n) if syscalls else contextlib.nullcontext()
    try:
        with traced:
            asyncio.run(process_pending(rt, parallel=parallel))
    finally:
        for mod, name, real in reversed(wrapped):
            setattr(mod, name, real)
    made = "made by hand" if by_hand else "made with new"
    print(f"per turn ({n} conversations {made} x 1 message, {how}, durability = fsync):")
    for k, what in WHAT.items():
        print(f"  {k:<15} {counts[k] / n:5.2f}   {what}")


if __name__ == "__main__":
    main()
