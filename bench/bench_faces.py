"""Faces benchmarks. Run: .venv/bin/python bench/bench_faces.py [--quick]

Prints, with the target next to each figure:
  conversation_check  p50/p99 of the MCP tool over stdio (real `contemplation mcp` process)
                      with 1,000 conversations, and of the tool body alone (in process)
  /api/conversations  p50/p99 of the dashboard's list, served by a real daemon (1,000 convs)
  MCP server start    spawn → answer to `initialize`, real process
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from contemplation.faces.mcp.calls import Faces  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import new_conversation, open_writer  # noqa: E402

TARGET_MS = 20.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def line(name: str, values_ms: list[float], target: str) -> None:
    print(
        f"{name:<34} p50 {statistics.median(values_ms):7.2f} ms   p99 {pct(values_ms, 99):7.2f} ms"
        f"   (n={len(values_ms)}, target {target})"
    )


def populate(home: Home, n: int) -> list[str]:
    tpl = load_template(home, "default")
    ids = []
    for i in range(n):
        conv = new_conversation(
            home, f"topic {i}", template=tpl, model="llama3.2", backend="ollama", durable=False
        )
        with open_writer(conv, durable=False) as w:
            w.append_block("CLAUDE", "OLLAMA", f"question {i} " + "q" * 300, msg_id="m1")
            r = w.reply("OLLAMA", "CLAUDE", "r1")
            r.content(f"answer {i} " + "a" * 600 + ("\nNEED: more data" if i % 7 == 0 else ""))
            r.finish()
        ids.append(conv.id)
    return ids


def env_for(home: Home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEMPLATION_")}
    env.update(
        CONTEMPLATION_HOME=str(home.root),
        XDG_CONFIG_HOME=str(home.root.parent / "xdg"),
        CONTEMPLATION_LOG_FORMAT="json",
    )
    return env


def bench_check_in_process(home: Home, ids: list[str], n: int) -> list[float]:
    faces = Faces(load(home=home.root, env={}, config=None))
    out = []
    for conv_id in random.choices(ids, k=n):
        t0 = time.perf_counter()
        faces.check(conv_id, 0)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def bench_check_stdio(home: Home, ids: list[str], n: int) -> list[float]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "contemplation", "mcp"], env=env_for(home), cwd=ROOT
    )

    async def main() -> list[float]:
        out = []
        async with Client(params) as c:
            for conv_id in random.choices(ids, k=20):  # warm-up
                await c.call_tool("conversation_check", {"conversation_id": conv_id})
            for conv_id in random.choices(ids, k=n):
                t0 = time.perf_counter()
                r = await c.call_tool("conversation_check", {"conversation_id": conv_id})
                out.append((time.perf_counter() - t0) * 1000)
                assert not r.is_error
        return out

    return asyncio.run(main())


def bench_api(home: Home, n: int) -> list[float]:
    env = env_for(home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "run", "--dashboard-port", "0"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        info = home.root / ".dashboard.json"
        deadline = time.monotonic() + 30
        while True:
            try:
                data = json.loads(info.read_text())
                if data.get("pid") == proc.pid:
                    break
            except (FileNotFoundError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the dashboard did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{data['port']}/api/conversations"
        time.sleep(3)  # let the start-up scan of every conversation finish
        out = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read()
            if i >= 20:
                out.append((time.perf_counter() - t0) * 1000)
        assert json.loads(body)["count"] >= 1000
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def bench_start(home: Home, runs: int) -> list[float]:
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-m", "contemplation", "mcp"],
            env=env_for(home),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert p.stdin and p.stdout
        p.stdin.write((json.dumps(request) + "\n").encode())
        p.stdin.flush()
        p.stdout.readline()
        out.append((time.perf_counter() - t0) * 1000)
        p.stdin.close()
        p.wait(10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 200 if args.quick else 1000
    random.seed(5)
    with tempfile.TemporaryDirectory() as tmp:
        home = Home(Path(tmp) / "home")
        t0 = time.perf_counter()
        ids = populate(home, 1000)
        print(f"1,000 conversations written in {time.perf_counter() - t0:.1f} s")
        line("conversation_check (stdio)", bench_check_stdio(home, ids, n), f"< {TARGET_MS} ms")
        line(
            "conversation_check (tool body)",
            bench_check_in_process(home, ids, n),
            f"< {TARGET_MS} ms",
        )
        line("/api/conversations (1,000)", bench_api(home, n // 2), f"< {TARGET_MS} ms")
        starts = bench_start(home, 3 if args.quick else 7)
        print(
            f"{'MCP server start (initialize)':<34} min {min(starts):7.0f} ms   median "
            f"{statistics.median(starts):7.0f} ms   (target well under 1000 ms)"
        )


if __name__ == "__main__":
    main()
