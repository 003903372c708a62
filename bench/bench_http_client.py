"""What one streamed reply costs the daemon in its HTTP client (why backends/http.py is on
aiohttp, not httpx).

The scripted Ollama-wire server runs in its own process on loopback; each client streams
the same ``/api/chat`` reply (a dozen NDJSON lines, one write each, as Ollama sends them)
``--requests`` times over one kept-alive connection, one request at a time. Measured in the
client's process: CPU time per request (``time.process_time``, every thread) and wall time
per request (p50 / p99).

  httpx       httpx.AsyncClient, the body read with aiter_bytes (the old backends' path)
  aiohttp     aiohttp.ClientSession, the body read with iter_any
  backend     OllamaBackend.stream, the product's whole path: aiohttp through backends/http,
              lines, JSON and events

Run: .venv/bin/python bench/bench_http_client.py [--requests 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_pickup import Server  # noqa: E402
from bench.turnbench import percentile  # noqa: E402
from contemplation.backends.base import PhaseTimeouts  # noqa: E402
from contemplation.backends.ollama import OllamaBackend  # noqa: E402
from contemplation.models import ChatMessage, ChatRequest  # noqa: E402

MODEL = "llama3.2"
TEXT = "one two three four five six seven eight nine ten eleven"  # echoed, a line per word
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": TEXT}],
    "stream": True,
    "options": {"num_ctx": 8192},
}

One = Callable[[], Awaitable[int]]


async def _httpx(url: str) -> tuple[One, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10.0))
    data = json.dumps(BODY).encode()

    async def one() -> int:
        req = client.build_request(
            "POST", "/api/chat", content=data, headers={"Content-Type": "application/json"}
        )
        resp = await client.send(req, stream=True)
        n = 0
        async for chunk in resp.aiter_bytes():
            n += chunk.count(b"\n")
        await resp.aclose()
        return n

    return one, client.aclose


async def _aiohttp(url: str) -> tuple[One, Callable[[], Awaitable[None]]]:
    session = aiohttp.ClientSession()
    data = json.dumps(BODY).encode()

    async def one() -> int:
        async with session.post(
            f"{url}/api/chat", data=data, headers={"Content-Type": "application/json"}
        ) as resp:
            n = 0
            async for chunk in resp.content.iter_any():
                n += chunk.count(b"\n")
        return n

    return one, session.close


async def _backend(url: str) -> tuple[One, Callable[[], Awaitable[None]]]:
    backend = OllamaBackend(url, timeouts=PhaseTimeouts(5.0, 10.0, 10.0, 60.0))
    request = ChatRequest(model=MODEL, messages=(ChatMessage(role="user", content=TEXT),))

    async def one() -> int:
        return sum([1 async for _ in backend.stream(request)])

    return one, backend.aclose


CLIENTS = {"httpx": _httpx, "aiohttp": _aiohttp, "backend": _backend}


async def measure(name: str, url: str, requests: int) -> tuple[float, list[float]]:
    """(CPU µs per request, wall times in ms)."""
    one, close = await CLIENTS[name](url)
    try:
        for _ in range(50):  # connect, warm the pool and the caches
            await one()
        walls: list[float] = []
        cpu0 = time.process_time()
        for _ in range(requests):
            t = time.perf_counter()
            if await one() <= 0:
                raise SystemExit(f"{name}: an empty reply")
            walls.append((time.perf_counter() - t) * 1000)
        cpu = (time.process_time() - cpu0) / requests * 1e6
    finally:
        await close()
    return cpu, walls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="each client this many times, in turn")
    args = ap.parse_args()
    server = Server()
    try:
        cpu: dict[str, list[float]] = {n: [] for n in CLIENTS}
        walls: dict[str, list[float]] = {n: [] for n in CLIENTS}
        for _ in range(args.rounds):  # interleaved, so drift on a noisy machine hits all alike
            for name in CLIENTS:
                c, w = asyncio.run(measure(name, server.url, args.requests))
                cpu[name].append(c)
                walls[name].extend(w)
    finally:
        server.stop()
    print(f"{args.requests} streamed /api/chat replies per client per round, {args.rounds} rounds")
    base = statistics.median(cpu["httpx"])
    for name in CLIENTS:
        med = statistics.median(cpu[name])
        runs = " / ".join(f"{c:.0f}" for c in cpu[name])
        print(
            f"  {name:8s} CPU per request {med:6.0f} µs ({runs})  {med / base:.2f}x httpx   "
            f"wall p50 {percentile(walls[name], 0.5):.2f} ms  p99 {percentile(walls[name], 0.99):.2f} ms"
        )


if __name__ == "__main__":
    main()
