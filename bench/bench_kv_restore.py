"""Restart-proof KV: three long conversations taking turns on one slot; and (``--restart``) a
long conversation resumed after the daemon and the server restarted.
Run: .venv/bin/python bench/bench_kv_restore.py [--rounds 10] [--words 12]
     .venv/bin/python bench/bench_kv_restore.py --restart [--tokens 4096]
     .venv/bin/python bench/bench_kv_restore.py --restart --conversations 20 [--tokens 512]

``--restart``: one conversation grown to about ``--tokens`` prompt tokens on a real
llama-server (one slot of 8,192 tokens, ``--slot-save-path``), then one more turn with both
warm (the slot holds it: the warm figure), then the daemon (a new runtime on the same home)
and the server (stopped and started on the same ``--slot-save-path``) restarted and one more
turn (its file restored first: the restored figure), then both restarted once more with the
durable map removed (the cold figure: today's behaviour without it). Per turn: the share of
its prompt the server reused (``cache_n`` over the prompt) and its time to first token,
the restore's own call included (measured around the client's slot call).

``--restart --conversations N``: N conversations, each grown to about ``--tokens`` and given
its warm turn in turn (the slot holds it then; the others' files are saved as the slot goes
on), then the daemon and the server restarted once and each given one more turn (restored
from its file): the warm and restored turns' reuse and time to first token, side by side
(no cold pass: the one-conversation run has it, and N cold prefills are minutes each here).

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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_prefix_cache import prefilled  # noqa: E402
from bench.turnbench import TurnHome  # noqa: E402
from contemplation.engine.pipeline import process_pending  # noqa: E402
from contemplation.engine.runtime import Runtime  # noqa: E402
from contemplation.store.layout import read_state  # noqa: E402
from contemplation.writer import drop_message, kvmap  # noqa: E402
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


LONG = (
    "Here is more of the design notes to keep in mind, word for word: " + " ".join(WORDS) + ". "
) * 12  # ~1,000 tokens a message


@dataclass
class Turned:
    share: float  # reused / prompt tokens
    prompt: int
    ttft_ms: float  # the restore's call (if any) plus the request's first token


async def burst(th: TurnHome) -> None:
    await process_pending(th.rt)
    await th.rt.aclose()


async def one_turn(th: TurnHome, conv: Any, text: str) -> Turned:
    spent: list[float] = []
    backend = th.rt.provider("openai").backend
    keep = backend.keep_slot  # type: ignore[attr-defined]

    async def timed(slot: int, action: str, filename: str) -> Any:
        t0 = time.monotonic()
        try:
            return await keep(slot, action, filename)
        finally:
            if action == "restore":
                spent.append((time.monotonic() - t0) * 1000)

    backend.keep_slot = timed  # type: ignore[attr-defined]
    drop_message(conv, text)
    await process_pending(th.rt)
    await th.rt.aclose()  # the slot saves in flight end (a daemon stopping)
    st = read_state(conv)
    assert st is not None and st.last_turn is not None, st
    prompt = st.last_turn.prompt_eval_count or 0
    cached = st.last_turn.cached_tokens or 0
    first = st.last_turn.first_token_ms or 0.0
    return Turned(cached / prompt if prompt else 0.0, prompt, sum(spent) + first)


def restarted(gguf: Path, tokens: int) -> dict[str, Turned]:
    server = LlamaServer(gguf, n_ctx=8192, n_parallel=1, slot_save=True).start()
    th = TurnHome("openai", "smollm2", {"temperature": 0, "num_predict": 16},
                  {"base_url": server.url})  # fmt: skip
    got: dict[str, Turned] = {}
    try:
        conv, _ = th.conversation("Resumed next morning", "Hello: keep these notes. " + LONG)
        asyncio.run(burst(th))
        grown = asyncio.run(one_turn(th, conv, LONG))
        while grown.prompt < tokens:
            grown = asyncio.run(one_turn(th, conv, LONG))
        got["warm"] = asyncio.run(one_turn(th, conv, "In one sentence: what matters most?"))
        for phase in ("restored", "cold"):
            server.stop()
            if phase == "cold":  # the durable map gone: today's behaviour
                (th.home.root / kvmap.FILE).unlink()
            server.start()
            th.rt = Runtime(settings=th.rt.settings, home=th.home)
            got[phase] = asyncio.run(one_turn(th, conv, f"And once more ({phase}): why?"))
        return got
    finally:
        asyncio.run(th.aclose())
        server.stop()


def notes(tokens: int) -> str:
    """About ``tokens`` tokens of notes (``LONG`` is ~1,000: ~85 a sentence)."""
    return ("Here is more of the design notes: " + " ".join(WORDS) + ". ") * max(1, tokens // 85)


def restarted_many(gguf: Path, n: int, tokens: int) -> dict[str, list[Turned]]:
    """``n`` conversations, each grown to about ``tokens`` and given a warm turn, then the
    daemon and the server restarted and each given one more turn (see the module)."""
    server = LlamaServer(gguf, n_ctx=8192, n_parallel=1, slot_save=True).start()
    th = TurnHome("openai", "smollm2", {"temperature": 0, "num_predict": 16},
                  {"base_url": server.url})  # fmt: skip
    chunk = notes(min(tokens, 1000))
    got: dict[str, list[Turned]] = {"warm": [], "restored": []}
    convs: list[Any] = []
    try:
        for i in range(n):
            conv, _ = th.conversation(f"Resumed {i}", f"Hello {i}: keep these notes. {chunk}")
            asyncio.run(burst(th))
            st = read_state(conv)
            while st is not None and (st.last_turn is None or (
                st.last_turn.prompt_eval_count or 0) < tokens):  # fmt: skip
                asyncio.run(one_turn(th, conv, chunk))
                st = read_state(conv)
            got["warm"].append(asyncio.run(one_turn(th, conv, "In one sentence: what matters?")))
            convs.append(conv)
            print(f"  {i + 1}/{n} warm: {got['warm'][-1]}", flush=True)
        server.stop()
        server.start()
        th.rt = Runtime(settings=th.rt.settings, home=th.home)
        for i, conv in enumerate(convs):
            got["restored"].append(asyncio.run(one_turn(th, conv, f"And once more ({i}): why?")))
        return got
    finally:
        asyncio.run(th.aclose())
        server.stop()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--words", type=int, default=12, help="words of each message")
    ap.add_argument("--restart", action="store_true", help="a long conversation resumed "
                    "after a daemon and a server restart")  # fmt: skip
    ap.add_argument("--tokens", type=int, default=4096, help="--restart: its prompt's size")
    ap.add_argument("--conversations", type=int, default=1, help="--restart: how many")
    args = ap.parse_args()
    gguf = peers.smollm2_gguf()
    if args.restart and args.conversations > 1:
        many = restarted_many(gguf, args.conversations, args.tokens)
        for phase, ts in many.items():
            shares, ttft = [t.share for t in ts], [t.ttft_ms for t in ts]
            print(f"{phase:9}: {len(ts)} turns, prompt p50 {pct([t.prompt for t in ts], 0.5):,} "
                  f"tokens, reused mean {statistics.mean(shares):.1%} min {min(shares):.1%}, "
                  f"time to first token p50 {pct(ttft, 0.5):,.0f} ms "
                  f"p90 {pct(ttft, 0.9):,.0f} ms")  # fmt: skip
        each = [r.ttft_ms / max(1.0, w.ttft_ms) for w, r in zip(
            many["warm"], many["restored"], strict=True)]  # fmt: skip
        print(f"restored / warm time to first token, per conversation: p50 {pct(each, 0.5):.2f}x"
              f", max {max(each):.2f}x")  # fmt: skip
        return
    if args.restart:
        turns = restarted(gguf, args.tokens)
        for phase, t in turns.items():
            print(f"{phase:9}: {t.prompt:,} prompt tokens, {t.share:.1%} reused, "
                  f"time to first token {t.ttft_ms:,.0f} ms")  # fmt: skip
        ratio = turns["restored"].ttft_ms / max(1.0, turns["warm"].ttft_ms)
        print(f"restored / warm time to first token: {ratio:.2f}x")
        return
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
