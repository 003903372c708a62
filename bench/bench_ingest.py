"""Ingest ceiling: how many streamed tokens a second can the daemon take in and write down?

Run: .venv/bin/python bench/bench_ingest.py [--slots 16] [--conversations 64]
     [--max-tokens 256] [--rounds 3]

A real model limits a benchmark to the model's speed; this one takes the model away. A server
of our own (its own process on loopback, aiohttp) speaks llama-server's streamed chat wire
format (``/props`` with ``total_slots``, SSE ``data:`` chunks of one token each, the last with
``usage`` and ``timings``, then ``[DONE]``) and answers as fast as it can. The daemon runs as
its own process with default settings (``concurrency`` auto: the slots from ``/props``), as in
bench_saturation.py, against a direct aiohttp client holding as many requests in flight. The
ratio daemon/direct is the share of a very fast server (a GPU's) the daemon can keep busy; the
direct rate is the ceiling of the server process and the loopback themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_saturation import Daemon, direct, messages, prompt  # noqa: E402
from tests.realpeers import _poll, free_port  # noqa: E402

SERVER = textwrap.dedent(
    """
    import asyncio, json, sys
    from aiohttp import web
    slots = int(sys.argv[2])
    token_s = float(sys.argv[3]) / 1000
    word = "tick"
    # a slot serves one request at a time, as llama-server's: a request naming a busy slot
    # (id_slot) waits for it, one naming none takes any free one
    free = asyncio.Queue()
    for i in range(slots):
        free.put_nowait(i)
    busy = set()
    named = {i: asyncio.Event() for i in range(slots)}
    stats = {"max_busy": 0, "waited_named": 0}

    async def take(slot):
        if slot is None or slot < 0 or slot >= slots:
            got = await free.get()
        else:
            while slot in busy:
                stats["waited_named"] += 1
                named[slot].clear()
                await named[slot].wait()
            got = slot
            # leave the free queue consistent: take it out of there
            rest = [free.get_nowait() for _ in range(free.qsize())]
            for r in rest:
                if r != got:
                    free.put_nowait(r)
        busy.add(got)
        stats["max_busy"] = max(stats["max_busy"], len(busy))
        return got

    def give(slot):
        busy.discard(slot)
        free.put_nowait(slot)
        named[slot].set()

    async def stats_view(request):
        out = dict(stats)
        stats.update(max_busy=len(busy), waited_named=0)  # each reading starts a new count
        return web.json_response(out)

    async def props(request):
        return web.json_response({"total_slots": slots,
            "default_generation_settings": {"n_ctx": 4096}})

    async def chat(request):
        body = await request.json()
        n = int(body.get("max_tokens") or body.get("n_predict") or 16)
        slot = await take(body.get("id_slot"))
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(n):
                if token_s:
                    await asyncio.sleep(token_s)
                chunk = {"choices": [{"index": 0, "delta": {"content": " " + word}}],
                         "object": "chat.completion.chunk", "model": "smollm2"}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
        finally:
            give(slot)
        last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": n, "total_tokens": 100 + n},
                "timings": {"cache_n": 0, "prompt_n": 100, "predicted_n": n,
                            "prompt_ms": 1.0, "predicted_ms": 1.0}}
        await resp.write(b"data: " + json.dumps(last).encode() + b"\\n\\ndata: [DONE]\\n\\n")
        await resp.write_eof()
        return resp

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "smollm2"}]})

    async def health(request):
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes([web.get("/props", props), web.post("/v1/chat/completions", chat),
                    web.get("/v1/models", models), web.get("/health", health),
                    web.get("/stats", stats_view)])
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
    """
)


def _busy(url: str, side: str) -> str:
    got = httpx.get(f"{url}/stats").json()
    return f"{side} {got['max_busy']}, {got['waited_named']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--token-ms", type=float, default=0.0,
                    help="each slot's time per token (0: as fast as it can; 4: a GPU's pace)")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="bench-ingest-")) / "server.log"
    with log.open("wb") as out:
        argv = [sys.executable, "-c", SERVER, str(port), str(args.slots), str(args.token_ms)]
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _poll(f"{url}/health", server, log, 30)  # (its log shown if it does not start)
        config = (
            f'[providers.box1]\nkind = "openai"\nurl = "{url}/v1"\napi_key = "none"\n'
            f'[aliases.small]\nmodel = "smollm2"\nproviders = ["box1"]\n'
            f"options = {{ num_predict = {args.max_tokens} }}\n"
        )
        daemon = Daemon(config)
        try:
            texts = [prompt(i) for i in range(args.conversations)]
            msgs = [messages(daemon.home, i, args.max_tokens) for i in range(len(texts))]
            asyncio.run(direct([url], args.slots, msgs, args.max_tokens))  # warm
            daemon.burst(daemon.conversations(2, "small", "small"), texts[:2])
            d_rates, c_rates = [], []
            busy: list[str] = []
            httpx.get(f"{url}/stats")
            for _ in range(args.rounds):
                wall, tokens = asyncio.run(direct([url], args.slots, msgs, args.max_tokens))
                d_rates.append(tokens / wall)
                busy.append(_busy(url, "direct"))
                convs = daemon.conversations(args.conversations, "small", "small")
                wall, tokens = daemon.burst(convs, texts)
                c_rates.append(tokens / wall)
                busy.append(_busy(url, "daemon"))
            d, c = statistics.median(d_rates), statistics.median(c_rates)
            print(
                f"machine: {os.cpu_count()} CPUs; {args.slots} slots, {args.conversations} "
                f"conversations a burst, {args.max_tokens} tokens each\n"
                f"direct {d:.0f} tok/s, daemon {c:.0f} tok/s, ratio {c / d:.2f}x "
                f"(rounds: direct {', '.join(f'{r:.0f}' for r in d_rates)}; "
                f"daemon {', '.join(f'{r:.0f}' for r in c_rates)})\n"
                f"slots busy at most, requests that waited for the slot they named: {'; '.join(busy)}",
                flush=True,
            )
        finally:
            daemon.stop()
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
