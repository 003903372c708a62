"""Batches of work that could hold the daemon's event loop, and how long they hold it.

Run: .venv/bin/python bench/bench_loop_hold.py [--convs 2000] [--seconds 12] [--log-mb 10]

"Loop held" is the longest a 1 ms ticker on the loop overran while the work ran.

  rescan, in process       every ``rescan_interval`` (5 s) the daemon looks at every active
                           conversation for a sign of new work no event announced (a few system
                           calls each): the scan's duration over ``convs`` conversations made
                           by ``new``, and the loop held meanwhile
  rescan, out of process   the daemon as its own process (default settings) beside ``convs``
                           idle conversations, the scripted Ollama-wire server in another
                           process: one message dropped every 50 ms for ``seconds`` (two or
                           more rescans run meanwhile), pickup p50 / p99 / max
  long log, in process     a turn in a conversation whose log is ``log-mb`` MB, at its first
                           sight (start-up): the whole log is parsed (~9 ms a megabyte); the
                           turn's duration and the loop held meanwhile
Target: the loop is never held by a batch of work (a few ms at any size; a thread holding the
interpreter lock gives it back every 5 ms, sys.getswitchinterval()).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_foundation import InstantBackend  # noqa: E402
from bench.bench_pickup import Server, folders, start_daemon  # noqa: E402
from bench.turnbench import percentile  # noqa: E402
from contemplation import backends  # noqa: E402
from contemplation.daemon.dispatcher import Dispatcher  # noqa: E402
from contemplation.engine.pipeline import process  # noqa: E402
from contemplation.engine.runtime import Runtime  # noqa: E402
from contemplation.engine.tracking import Tracked  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Conv, Home  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation, open_writer  # noqa: E402


async def _rescan(d: Dispatcher) -> None:
    """One rescan, however this version of the dispatcher runs it."""
    done = d.rescan()
    if inspect.isawaitable(done):
        await done


async def _lateness(stop: asyncio.Event) -> float:
    """The longest a 1 ms sleep overran until ``stop``: how long the loop was held."""
    worst = 0.0
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        worst = max(worst, time.perf_counter() - t - 0.001)
    return worst


async def _in_process(home: Home, rounds: int) -> tuple[list[float], list[float]]:
    settings = load(home=home.root, env={}, config=None, overrides={"log_level": "warning"})
    d = Dispatcher(Runtime(settings=settings, home=home))
    for c in home.active.iterdir():
        d.seen.remember_size(Conv(c))  # as after the start-up pass: every log as left
    held: list[float] = []
    took: list[float] = []
    for _ in range(rounds):
        stop = asyncio.Event()
        tick = asyncio.create_task(_lateness(stop))
        await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        await _rescan(d)
        took.append((time.perf_counter() - t0) * 1000)
        stop.set()
        held.append(await tick * 1000)
    await d.drain(1.0)
    return took, held


def _long_conversation(home: Home, megabytes: float) -> Conv:
    conv = new_conversation(
        home, "long", template=load_template(home, "default"), model="m", backend="instant"
    )
    size, i = 0, 0
    with open_writer(conv, durable=False) as w:
        while size < megabytes * 1024 * 1024:
            text = f"line {i} of a long conversation, NEED: maybe\n" * 40
            pair = ("CLAUDE", "INSTANT") if i % 2 == 0 else ("INSTANT", "CLAUDE")
            w.append_block(*pair, text, msg_id=f"b{i}")
            size += len(text) + 60
            i += 1
    return conv


async def _long_log(home: Home, megabytes: float, rounds: int) -> tuple[list[float], list[float]]:
    backends.register("instant", lambda s: InstantBackend())
    settings = load(
        home=home.root, env={}, config=None, overrides={"log_level": "warning", "settle_seconds": 0}
    )
    rt = Runtime(settings=settings, home=home)
    took: list[float] = []
    held: list[float] = []
    for r in range(rounds):
        conv = _long_conversation(home, megabytes)
        drop_message(conv, f"question {r}")
        os.sync()  # a log written long ago: its first fsync is not the whole file's writeback
        stop = asyncio.Event()
        tick = asyncio.create_task(_lateness(stop))
        await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        await process(conv, rt, Tracked())  # a new Tracked: the first sight, as at start-up
        took.append((time.perf_counter() - t0) * 1000)
        stop.set()
        held.append(await tick * 1000)
    await rt.aclose()
    return took, held


def _out_of_process(home: Home, convs: list[Conv], seconds: float) -> list[float]:
    tmp = home.root.parent
    server = Server()
    daemon = start_daemon(home, server, tmp)
    pickups: list[float] = []
    try:
        time.sleep(2.0)  # the start-up pass over every folder
        seen = len(server.chats())
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            drop_message(convs[i], "ping")
            t0 = time.time()
            pickups.append((server.wait_chats(seen + 1)[-1] - t0) * 1000)
            seen += 1
            i += 1
            time.sleep(0.05)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        server.stop()
    return pickups


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--log-mb", type=float, default=10.0)
    args = ap.parse_args()
    home = Home(Path(tempfile.mkdtemp(prefix="contemplation-rescan-")) / "home")
    convs = folders(home, args.convs, by_hand=False)
    took, held = asyncio.run(_in_process(home, args.rounds))
    print(f"rescan of {args.convs} idle conversations, in process (n={args.rounds}):")
    print(f"  scan takes        p50 {percentile(took, 0.5):7.2f} ms   max {max(took):7.2f} ms")
    print(
        f"  loop held         p50 {percentile(held, 0.5):7.2f} ms   max {max(held):7.2f} ms"
        "   (target: a few ms at any size)"
    )
    long_home = Home(Path(tempfile.mkdtemp(prefix="contemplation-long-")) / "home")
    took, held = asyncio.run(_long_log(long_home, args.log_mb, max(1, args.rounds // 2)))
    print(f"a turn at first sight of a {args.log_mb:g} MB log, in process (n={len(took)}):")
    print(f"  turn takes        p50 {percentile(took, 0.5):7.2f} ms   max {max(took):7.2f} ms")
    print(f"  loop held         p50 {percentile(held, 0.5):7.2f} ms   max {max(held):7.2f} ms")
    pickups = _out_of_process(home, convs, args.seconds)
    print(
        f"daemon beside {args.convs} idle conversations, a drop every 50 ms for "
        f"{args.seconds:g} s (n={len(pickups)}):"
    )
    print(
        f"  pickup            p50 {percentile(pickups, 0.5):7.2f} ms   "
        f"p99 {percentile(pickups, 0.99):7.2f} ms   max {max(pickups):7.2f} ms"
    )


if __name__ == "__main__":
    main()
