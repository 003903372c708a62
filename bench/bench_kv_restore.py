"""Restart-proof KV: three long conversations taking turns on one slot.
Run: .venv/bin/python bench/bench_kv_restore.py [--rounds 10] [--words 12]

Against a real llama-server (xllamacpp's build, SmolLM2-135M, started here: one slot of
8,192 tokens), through the daemon's own path (``process_pending`` with the openai backend).
Each round every conversation gets a message of ``--words`` words (replies of at most 24
tokens), in turn, so each turn finds the slot holding another conversation's history; the
conversations grow long (a long single message is summarised at once: no cache to keep). Per turn after a conversation's
first: the share of its prompt the server reused (its ``timings.cache_n`` over the prompt's
tokens, as the ledger keeps them), and what the server prefilled in all (``/metrics``
``llamacpp:prompt_tokens_total``). Run twice: the server started with ``--slot-save-path``
(the daemon saves a slot for its conversation before another takes it and restores it when
it comes back), and without (as llama-server starts by default: nothing kept but the slot).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_prefix_cache import prefilled  # noqa: E402
from bench.turnbench import TurnHome  # noqa: E402
from contemplation.engine.pipeline import process_pending  # noqa: E402
from contemplation.store.layout import read_state  # noqa: E402
from contemplation.writer import drop_message  # noqa: E402
from tests import peers  # noqa: E402
from tests.realpeers import LlamaServer  # noqa: E402

TOPICS = ["Folder queues", "Crash safety", "Log rotation"]
WORDS = ["queue", "file", "folder", "daemon", "reply", "token", "cache", "slot", "disk",
         "write", "restore", "save", "turn", "prompt", "model", "server", "history"]  # fmt: skip


def message(conv: int, turn: int, words: int) -> str:
    body = " ".join(WORDS[(conv * 7 + turn * 3 + i) % len(WORDS)] for i in range(words))
    return f"Turn {turn}: in one sentence, which of these matters most? {body}"


@dataclass
class Result:
    shares: list[float]  # per returning turn: reused / prompt tokens
    sent: int
    reused: int
    prefilled: int  # what the server computed in all (/metrics)
    seconds: float
    failed: int  # restores a turn found not to hold
    files: int  # slot files the daemon keeps


async def alternate(url: str, rounds: int, words: int) -> Result:
    th = TurnHome("openai", "smollm2", {"temperature": 0, "num_predict": 24}, {"base_url": url})
    try:
        convs = [th.conversation(t, message(i, 0, words))[0] for i, t in enumerate(TOPICS)]
        shares: list[float] = []
        sent = reused = 0
        before, t0 = prefilled(url), time.monotonic()
        for turn in range(rounds):
            for i, conv in enumerate(convs):
                if turn:
                    drop_message(conv, message(i, turn, words))
                await process_pending(th.rt)
                st = read_state(conv)
                assert st is not None and st.last_turn is not None, st
                prompt = st.last_turn.prompt_eval_count or 0
                cached = st.last_turn.cached_tokens or 0
                if turn:  # its history was in the slot before another conversation's turn
                    shares.append(cached / prompt if prompt else 0.0)
                    sent, reused = sent + prompt, reused + cached
        affinity = th.rt.provider("openai").affinity
        return Result(
            shares, sent, reused, prefilled(url) - before, time.monotonic() - t0,
            affinity.restores_failed, len(affinity.files),
        )  # fmt: skip
    finally:
        await th.aclose()


def run(gguf: Path, keep: bool, args: argparse.Namespace) -> Result:
    server = LlamaServer(gguf, n_ctx=8192, n_parallel=1, slot_save=keep).start()
    try:
        return asyncio.run(alternate(server.url, args.rounds, args.words))
    finally:
        server.stop()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--words", type=int, default=12, help="words of each message")
    args = ap.parse_args()
    gguf = peers.smollm2_gguf()
    got = {keep: run(gguf, keep, args) for keep in (True, False)}
    for keep, r in got.items():
        late = r.shares[len(r.shares) // 2 :]
        print(
            f"{'save/restore on ' if keep else 'save/restore off'}: {len(r.shares)} returning "
            f"turns, reused {r.reused:,} of {r.sent:,} prompt tokens "
            f"({r.reused / max(1, r.sent):.1%}); a turn: mean {statistics.mean(r.shares):.1%}, "
            f"p10 {pct(r.shares, 0.1):.1%}, min {min(r.shares):.1%} (later half: mean "
            f"{statistics.mean(late):.1%}, min {min(late):.1%}); the server prefilled "
            f"{r.prefilled:,} tokens in {r.seconds:.1f} s; failed restores {r.failed}, "
            f"slot files {r.files}"
        )
    ratio = got[True].prefilled / max(1, got[False].prefilled)
    print(f"prefilled with restores / without: {ratio:.2f}x")


if __name__ == "__main__":
    main()
