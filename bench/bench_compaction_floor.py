"""Compaction at the floor of the server's cache.
Run: .venv/bin/python bench/bench_compaction_floor.py [--turns 18] [--slots 1024,4096]

A real llama-server (xllamacpp's build, SmolLM2-135M, started here), one slot of each size in
``--slots``, through the daemon's own path (``process_pending``, openai backend) and a proxy
that keeps each request's ``timings``. One dialogue of ``--turns`` turns of about 50 new
tokens (the agent's message and the reply before it; replies of at most 48 tokens). Prints,
per slot size: each summary call's reuse (``cache_n`` of ``cache_n + prompt_n``), the turn
after it, and the prompt tokens recomputed (every request's ``prompt_n``, the summary calls
included) against the new tokens, a turn. Token counts, the server's own: load does not move
them. Targets: every summary call reuses >= 80 % of its prompt; recomputed <= 1.6x the new
text a turn in a 1,024-token slot, <= 1.3x in a 4,096-token one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.engine.runtime import Runtime  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Home, read_metadata  # noqa: E402
from contemplation.store.logview import LogView  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation, write_metadata  # noqa: E402
from tests import peers  # noqa: E402
from tests.conftest import run_burst  # noqa: E402
from tests.realpeers import LlamaServer  # noqa: E402
from tests.system.test_slot_affinity import Recorder  # noqa: E402

ASK = "Give one more short idea about keeping a queue of text files safe on a busy disk. ({i})"


def tokens(url: str, text: str) -> int:
    return len(httpx.post(f"{url}/tokenize", json={"content": text}, timeout=30).json()["tokens"])


def dialogue(url: str, window: int, turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        home = Home(Path(tmp) / "home")
        overrides = {"settle_seconds": 0, "log_level": "warning", "openai": {"base_url": url}}
        rt = Runtime(settings=load(home=home.root, env={}, config=None, overrides=overrides),
                     home=home)  # fmt: skip
        conv = new_conversation(home, "A long dialogue", template=load_template(home, "default"),
                                model="smollm2", backend="openai")  # fmt: skip
        meta = read_metadata(conv)
        assert meta is not None
        options = {"temperature": 0, "num_predict": 48, "num_ctx": window}
        write_metadata(conv, meta.model_copy(update={"options": options}))
        new, reply = 0, ""
        for i in range(turns):
            drop_message(conv, ASK.format(i=i))
            run_burst(rt)
            new += tokens(url, ASK.format(i=i)) + tokens(url, reply) + 10  # + role markers
            reply = LogView(conv, "agent").refresh().blocks[-1].text
        return {"new": new}


def run(window: int, turns: int) -> str:
    server = LlamaServer(peers.smollm2_gguf(), n_ctx=window, n_parallel=1).start()
    recorder = Recorder(server.url)
    try:
        got = dialogue(recorder.url, window, turns)
    finally:
        recorder.stop()
        server.stop()
    chats = recorder.chats
    asks = [j for j, (b, _) in enumerate(chats) if str(b["messages"][-1]["content"]).startswith(
        "Summarise")]  # fmt: skip
    reuse = [c["cache_n"] / max(1, c["cache_n"] + c["prompt_n"]) for c in (chats[j][1] for j in asks)]
    after = [chats[j + 1][1]["cache_n"] for j in asks if j + 1 < len(chats)]
    recomputed = sum(t["prompt_n"] for _, t in chats)
    return (
        f"{window}-token slot, {turns} turns: {len(asks)} summaries, each reusing "
        f"{', '.join(f'{r:.0%}' for r in reuse) or '-'} of its prompt; the turn after reused "
        f"{after or '-'} tokens; recomputed {recomputed / turns:.0f} a turn vs "
        f"{got['new'] / turns:.0f} new: {recomputed / got['new']:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=18)
    ap.add_argument("--slots", default="1024,4096")
    args = ap.parse_args()
    for window in (int(w) for w in args.slots.split(",")):
        print(run(window, args.turns), flush=True)


if __name__ == "__main__":
    main()
