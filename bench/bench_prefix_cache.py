"""How much of each prompt the server reuses from its cache.
Run: .venv/bin/python bench/bench_prefix_cache.py [--burst 8] [--turns 30] [--old] [--no-copy] [--cold]

Against a real llama-server (xllamacpp's build, SmolLM2-135M, started here), through the
daemon's own path (``process_pending`` with the openai backend, as bench_overhead does).
What the server recomputed is read from its own counter (``/metrics``
``llamacpp:prompt_tokens_total``: prompt tokens it prefilled, the cached ones not counted);
what was sent from the reply's ``usage.prompt_tokens`` (the whole prompt).

  burst     one conversation of the default template, then ``--burst - 1`` more at once
            (4 slots of 2,048 tokens): per later conversation, the tokens of its first prompt
            the server reused (its ``timings.cache_n``), against the shared part (the system
            prompt as the daemon sends it, up to the topic). The server is started with
            ``--slot-save-path`` (it copies a slot's cache into another); ``--no-copy``:
            without it, as llama-server starts by default. ``--cold``: all ``--burst`` at
            once on empty slots (reused summed over all, against the shared part times
            ``--burst - 1``: the first served prefills it)
  dialogue  one conversation of ``--turns`` turns in one 1,024-token slot (replies of at most
            48 tokens): prompt tokens recomputed a turn (the summary calls included) against
            the new tokens a turn (the agent's message and the reply before it)

``--old`` runs the same with the order and compaction before the reorder (the topic first in the
system prompt; the summary call a transcript in a prompt of its own; the history kept after
a summary filled to the brim), for the before/after figures.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turnbench import TurnHome  # noqa: E402
from contemplation.engine.pipeline import process_pending  # noqa: E402
from contemplation.needs.tools import registry  # noqa: E402
from contemplation.prompt import budget, prompts, summarise  # noqa: E402
from contemplation.store.layout import read_state  # noqa: E402
from contemplation.store.logview import LogView  # noqa: E402
from contemplation.writer import drop_message  # noqa: E402
from tests import peers  # noqa: E402
from tests.realpeers import LlamaServer  # noqa: E402

MODEL = "smollm2"
_METRIC = re.compile(r"^llamacpp:prompt_tokens_total\s+(\S+)$", re.M)
TOPICS = ["Folder queues", "Cache eviction", "Crash safety", "Log rotation", "Slot affinity",
          "Prompt order", "Token budgets", "Summaries", "Backpressure", "Index search"]  # fmt: skip


def prefilled(url: str) -> int:
    """Prompt tokens the server has prefilled so far (cache hits not counted)."""
    m = _METRIC.search(httpx.get(f"{url}/metrics", timeout=10).text)
    return int(float(m.group(1))) if m else 0


def tokens(url: str, text: str) -> int:
    r = httpx.post(f"{url}/tokenize", json={"content": text}, timeout=10)
    return len(r.json()["tokens"])


def use_old_order() -> None:
    """The system prompt, the summary call and the compaction as they were before the reorder."""
    old_intro = (
        "You are in an asynchronous conversation with {agent} (an AI agent or a person), "
        "about: {topic}."
    )

    def system_prompt(meta: Any, template_prompt: str = "", **kw: Any) -> str:
        offered = kw.get("needs")
        offered = (
            prompts.need_forms(registry.default_rules()) if offered is None else offered
        )
        own = (meta.system_prompt or template_prompt).strip()
        text = "\n\n".join([old_intro, own or prompts.STYLE, prompts.protocol(offered)])
        return text.replace("{agent}", meta.agent_label.title()).replace("{topic}", meta.topic)

    prompts.system_prompt = system_prompt
    def at_the_edge(window: int, reserve: int, tools_cost: int = 0) -> int:
        return max(0, window - reserve - tools_cost)  # compaction waited for the edge

    def transcript(fitted: budget.Plan, *, think: bool | None) -> Any:
        return budget.summary_request_for(fitted, think=think)  # a prompt of its own

    summarise.cached_request = transcript
    budget.compact_at = at_the_edge
    budget.LOW_WATER = 1.0


async def burst(url: str, n: int, cold: bool = False) -> dict[str, float]:
    th = TurnHome("openai", MODEL, {"temperature": 0, "num_predict": 8}, {"base_url": url})
    try:
        first, meta = th.conversation(TOPICS[0], "In one sentence: what is this about?")
        if not cold:
            await process_pending(th.rt)
        offered = prompts.need_forms(th.rt.need_router().offered(meta.template))  # as sent
        shared_text = prompts.system_prompt(
            meta, th.template.system_prompt, needs=offered
        ).split(TOPICS[0])[0]
        shared = tokens(url, shared_text)
        convs = [th.conversation(TOPICS[i % len(TOPICS)], "In one sentence: what is this about?")[0]
                 for i in range(1, n)]  # fmt: skip
        convs = [first, *convs] if cold else convs  # cold: the first is one of the burst
        before, t0 = prefilled(url), time.monotonic()
        await process_pending(th.rt)
        took = time.monotonic() - t0
        recomputed = prefilled(url) - before
        sent = cached = 0
        for conv in convs:
            st = read_state(conv)
            assert st is not None and st.last_turn is not None, st
            sent += st.last_turn.prompt_eval_count or 0
            cached += min(st.last_turn.cached_tokens or 0, shared)  # the server's cache_n
        return {"conversations": len(convs), "shared": shared, "sent": sent, "recomputed": recomputed,
                "reused_of_shared": cached / (shared * (n - 1)), "seconds": took}  # fmt: skip
    finally:
        await th.aclose()


async def dialogue(url: str, turns: int) -> dict[str, float]:
    th = TurnHome("openai", MODEL, {"temperature": 0, "num_predict": 48}, {"base_url": url})
    try:
        ask = "Give one more short idea about keeping a queue of text files safe. ({i})"
        conv, meta = th.conversation("A long dialogue", ask.format(i=0))
        recomputed = new = 0
        reply = ""
        for i in range(turns):
            if i:
                drop_message(conv, ask.format(i=i))
            before = prefilled(url)
            await process_pending(th.rt)
            recomputed += prefilled(url) - before
            new += tokens(url, ask.format(i=i)) + tokens(url, reply) + 10  # + role markers
            reply = LogView(conv, meta.agent_label).refresh().blocks[-1].text
            print(f"turn {i + 1}: recomputed {recomputed}, new {new}", flush=True)
        log = conv.log.read_text()
        return {"turns": turns, "recomputed": recomputed / turns, "new": new / turns,
                "summaries": log.count("=== NOTE: summary of the log")}  # fmt: skip
    finally:
        await th.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--old", action="store_true", help="the order before the reorder")
    ap.add_argument("--no-copy", action="store_true", help="a server without --slot-save-path")
    ap.add_argument("--cold", action="store_true", help="the whole burst at once, no slot warm")
    args = ap.parse_args()
    if args.old:
        use_old_order()
    gguf = peers.smollm2_gguf()
    b: dict[str, float] = {}
    if args.burst:
        server = LlamaServer(gguf, n_ctx=2048, n_parallel=4, slot_save=not args.no_copy).start()
        try:
            b = asyncio.run(burst(server.url, args.burst, cold=args.cold))
        finally:
            server.stop()
    if b:
        copies = ("no slot copies" if args.no_copy else "slot copies") + (", cold" * args.cold)
        print(f"burst of {args.burst} ({'old order' if args.old else 'canonical order'}, {copies}): "
              f"shared prompt {b['shared']} tokens; the {b['conversations']} {'' if args.cold else 'later '}first turns "
              f"sent {b['sent']}, recomputed {b['recomputed']}: reused "
              f"{b['reused_of_shared']:.0%} of the shared prompt, in {b['seconds']:.1f} s")  # fmt: skip
    if not args.turns:
        return
    server = LlamaServer(gguf, n_ctx=1024, n_parallel=1).start()
    try:
        d = asyncio.run(dialogue(server.url, args.turns))
    finally:
        server.stop()
    print(f"dialogue of {d['turns']} turns in a 1,024-token slot: {d['summaries']} summaries; "
          f"recomputed {d['recomputed']:.0f} tokens a turn, new {d['new']:.0f}: "
          f"{d['recomputed'] / d['new']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
