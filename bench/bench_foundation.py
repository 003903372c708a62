"""Foundation benchmarks. Run: .venv/bin/python bench/bench_foundation.py [--quick]

Prints, with the target next to each figure:
  pickup latency   drop (rename into inbox/) → the request reaching the backend, real daemon process
  turns per second 1,000 conversations × 1 message through process_pending, instant in-process backend
  parse            full parse of a 10 MB log; incremental parse after one appended block
  daemon RSS / fds a real daemon process holding 1,000 conversations
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation import backends  # noqa: E402
from contemplation.backends.base import Capabilities, Check  # noqa: E402
from contemplation.engine.pipeline import Runtime, process_pending  # noqa: E402
from contemplation.models import BackendSession, ChatRequest, StreamEvent, Usage  # noqa: E402
from contemplation.protocol import logformat  # noqa: E402
from contemplation.protocol.parser import parse  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402
from contemplation.store.logview import LogView  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation, open_writer  # noqa: E402
from tests.fakes.ollama_server import FakeOllama  # noqa: E402


class InstantBackend:
    """Answers at once: measures contemplation's own cost per turn."""

    name = "instant"
    label = "INSTANT"
    concurrency = 64

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        yield StreamEvent("content", text="ok")
        yield StreamEvent("done", usage=Usage(eval_count=1))

    async def capabilities(self, model: str) -> Capabilities:
        return Capabilities()

    async def check(self, model: str | None) -> list[Check]:
        return []

    async def models(self) -> list[str]:
        return []

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None

    async def aclose(self) -> None:
        return None


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def row(name: str, value: str, target: str, ok: bool | None) -> dict[str, object]:
    mark = "" if ok is None else ("met" if ok else "MISSED")
    print(f"  {name:<58} {value:>10}   target {target:<14} {mark}")
    return {"name": name, "value": value, "target": target, "met": ok}


def env_for(home: Home, fake: FakeOllama) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "OLLAMA_"))}
    env.update(
        CONTEMPLATION_HOME=str(home.root),
        OLLAMA_HOST=fake.url,
        CONTEMPLATION_LOG_FORMAT="json",
        CONTEMPLATION_LOG_LEVEL="warning",
        XDG_CONFIG_HOME=str(home.root.parent / "xdg"),
    )
    return env


def start_daemon(env: dict[str, str], home: Home) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "run"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while not home.daemon_info.exists():
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit("daemon did not start")
        time.sleep(0.01)
    time.sleep(0.3)  # let the initial scan and the watch settle before measuring
    return proc


def bench_pickup(n: int, durability: str) -> list[dict[str, object]]:
    tmp = Path(tempfile.mkdtemp())
    home = Home(tmp / "home")
    fake = FakeOllama().start()
    tpl = load_template(home, "default")
    convs = [
        new_conversation(home, f"pickup {i}", template=tpl, model="llama3.2", backend="ollama")
        for i in range(n)
    ]
    proc = start_daemon({**env_for(home, fake), "CONTEMPLATION_DURABILITY": durability}, home)
    lat: list[float] = []
    try:
        for conv in convs:
            fake.chat_arrived.clear()
            drop_message(conv, "ping")  # write a dot-file, fsync, rename into inbox/
            t0 = time.time()  # the message is in the inbox from here on
            if not fake.chat_arrived.wait(10):
                raise SystemExit("no request reached the backend")
            lat.append((fake.chat_requests()[-1]["_time"] - t0) * 1000)
            time.sleep(0.02)  # let the reply finish before the next drop
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        fake.stop()
    return [
        row(
            f"pickup p50, durability={durability} (n={n})",
            f"{pct(lat, 50):.2f} ms",
            "≤ 5 ms",
            pct(lat, 50) <= 5,
        ),
        row(
            f"pickup p99, durability={durability} (n={n})",
            f"{pct(lat, 99):.2f} ms",
            "≤ 50 ms",
            pct(lat, 99) <= 50,
        ),
    ]


def bench_turns(
    n: int, durability: str, *, by_hand: bool = False
) -> tuple[dict[str, object], Home]:
    """``by_hand``: folders made by hand (only ``inbox/<file>``): each turn also pays for
    the conversation's first sight."""
    backends.register("instant", lambda s: InstantBackend())
    tmp = Path(tempfile.mkdtemp())
    home = Home(tmp / "home")
    tpl = load_template(home, "default")
    for i in range(n):
        if by_hand:
            inbox = home.active / f"hand-{i:05d}" / "inbox"
            inbox.mkdir(parents=True)
            (inbox / "q.txt").write_text(f"message {i}\n")
            continue
        conv = new_conversation(
            home, f"load {i}", template=tpl, model="m", backend="instant", durable=False
        )
        drop_message(conv, f"message {i}")
    overrides: dict[str, object] = {
        "settle_seconds": 0, "durability": durability, "log_level": "warning"
    }  # fmt: skip
    if by_hand:
        overrides.update(default_backend="instant", default_model="m")
    settings = load(home=home.root, env={}, config=None, overrides=overrides)
    rt = Runtime(settings=settings, home=home)
    t0 = time.perf_counter()
    asyncio.run(process_pending(rt))
    dt = time.perf_counter() - t0
    done = sum(
        1
        for c in home.active.iterdir()
        if b"=== INSTANT -> CLAUDE" in (c / "messages.log").read_bytes()
    )
    assert done == n, f"only {done}/{n} conversations got their turn"
    rate = n / dt
    made = " made by hand" if by_hand else ""
    return row(
        f"turns/s, {n} conversations{made}, durability={durability}",
        f"{rate:.0f} /s",
        "≥ 1000 /s",
        rate >= 1000,
    ), home


def bench_parse() -> list[dict[str, object]]:
    parts: list[str] = []
    size, i = 0, 0
    while size < 10 * 1024 * 1024:
        agent = i % 2 == 0
        text = (
            f"line {i} of the conversation with some words NEED: maybe\n" * 20
        ) + "=== tricky === line\n"
        chunk = (
            ("\n" if parts else "")
            + logformat.header("CLAUDE" if agent else "OLLAMA", "OLLAMA" if agent else "CLAUDE")
            + logformat.body(text)
        )
        parts.append(chunk)
        size += len(chunk)
        i += 1
    data = "".join(parts).encode()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        result = parse(data)
        times.append((time.perf_counter() - t0) * 1000)
    full = min(times)
    tmp = Path(tempfile.mkdtemp())
    home = Home(tmp / "home")
    conv = new_conversation(
        home, "parse", template=load_template(home, "default"), model="m", backend="ollama"
    )
    conv.log.write_bytes(data)
    view = LogView(conv)
    view.refresh()
    inc: list[float] = []
    with open_writer(conv, durable=False) as w:
        w.state.log.size = len(data)
        for k in range(50):
            w.append_block("CLAUDE", "OLLAMA", f"one more block {k}", msg_id=f"b{k}")
            t0 = time.perf_counter()
            r = view.refresh()
            inc.append((time.perf_counter() - t0) * 1000)
    assert len(r.blocks) == len(result.blocks) + 50
    return [
        row(
            f"full parse, {len(data) / 1e6:.1f} MB log ({len(result.blocks)} blocks)",
            f"{full:.1f} ms",
            "< 100 ms",
            full < 100,
        ),
        row(
            "incremental parse, one appended block (p50)",
            f"{statistics.median(inc):.3f} ms",
            "(no target)",
            None,
        ),
    ]


def bench_rss(home: Home) -> list[dict[str, object]]:
    fake = FakeOllama().start()
    # the instant backend lives in-process only; point these conversations at the fake instead
    for c in home.active.iterdir():
        meta = json.loads((c / "metadata.json").read_text())
        meta["backend"] = "ollama"
        (c / "metadata.json").write_text(json.dumps(meta))
    proc = start_daemon(env_for(home, fake), home)
    try:
        time.sleep(2.0)  # let it scan everything once
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS")))
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        threads = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Threads")))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        fake.stop()
    n = sum(1 for _ in home.active.iterdir())
    return [
        row(
            f"daemon RSS with {n} conversations",
            f"{rss_kb / 1024:.1f} MB",
            "≤ 100 MB",
            rss_kb / 1024 <= 100,
        ),
        row(
            f"daemon open fds / threads with {n} conversations",
            f"{fds} / {threads}",
            "(flat)",
            None,
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    n_conv = 200 if args.quick else 1000
    print(
        f"contemplation foundation benchmarks — {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    rows = bench_pickup(50 if args.quick else 200, "fsync")
    rows += bench_pickup(50 if args.quick else 200, "none")
    r, _ = bench_turns(n_conv, "none")
    rows.append(r)
    r, home = bench_turns(n_conv, "fsync")
    rows.append(r)
    r, _ = bench_turns(n_conv, "fsync", by_hand=True)
    rows.append(r)
    rows += bench_parse()
    rows += bench_rss(home)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
