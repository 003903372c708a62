"""Two llama-servers generating at once on one machine: every core each, or a share each.

Run: .venv/bin/python bench/bench_threads.py [--tokens 200] [--rounds 3] [--limit 120]

Why the test suite gives each pytest worker's llama-servers their share of the cores
(``tests/realpeers.py``, ``share_of_the_cores``): llama.cpp's threads spin while they wait for
each other, so two servers that each use every core, generating at the same time, can starve
each other. For each thread setting (0: llama.cpp's choice; then cores // 2), two SmolLM2
servers are started; each round times one reply of ``--tokens`` tokens (temperature 0, no
prompt cache) from one server alone, then from both at once. A request that takes longer than
``--limit`` seconds is counted as not finished.

Prints, per setting: the alone and side-by-side reply times (p50 and max over the rounds, in
seconds), the side-by-side wall time, and its ratio to the alone time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import peers  # noqa: E402
from tests.realpeers import LlamaServer, share_of_the_cores  # noqa: E402

PROMPT = "Write a long story about a cat who keeps a queue of text files in order. " * 8


def reply(url: str, tokens: int, limit: float) -> float:
    """Seconds for one reply of ``tokens`` tokens; ``inf`` past ``limit``."""
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        "cache_prompt": False,
    }
    started = time.monotonic()
    try:
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=limit).raise_for_status()
    except httpx.TimeoutException:
        return float("inf")
    return time.monotonic() - started


def side_by_side(urls: list[str], tokens: int, limit: float) -> tuple[list[float], float]:
    """Each server's reply time, all asked at once, and the wall time of the whole."""
    took: list[float] = []
    threads = [
        threading.Thread(target=lambda u=url: took.append(reply(u, tokens, limit))) for url in urls
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took, time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=float, default=120.0)
    args = ap.parse_args()
    gguf = peers.smollm2_gguf()
    cores = os.cpu_count() or 1
    print(f"{cores} cores; two servers; {args.tokens} tokens a reply; {args.rounds} rounds")
    for threads in (0, share_of_the_cores(servers=2)):
        servers = [LlamaServer(gguf, n_ctx=4096, threads=threads).start() for _ in range(2)]
        try:
            urls = [s.url for s in servers]
            for url in urls:
                reply(url, 8, args.limit)  # loaded and warm
            alone = [reply(urls[0], args.tokens, args.limit) for _ in range(args.rounds)]
            each: list[float] = []
            walls: list[float] = []
            for _ in range(args.rounds):
                took, wall = side_by_side(urls, args.tokens, args.limit)
                each += took
                walls.append(wall)
        finally:
            for s in servers:
                s.stop()
        a50 = statistics.median(alone)
        w50 = statistics.median(walls)
        print(
            f"threads={threads or 'llama.cpp'}: alone p50 {a50:.2f} max {max(alone):.2f}; "
            f"side by side each p50 {statistics.median(each):.2f} max {max(each):.2f}; "
            f"wall p50 {w50:.2f} ({w50 / a50:.2f}x alone)"
        )


if __name__ == "__main__":
    main()
