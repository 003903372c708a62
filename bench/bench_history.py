"""What a turn pays to turn a long log into the model's history: ``history_blocks`` over a
parsed log of about ``--blocks`` blocks (an agent's message and a reply, in turn; every tenth
reply cancelled, every seventh carried on by a second reply after ``continue``), timed ``--runs`` times in one process.
Prints the min and p50 (ms) and the messages made.

Run: .venv/bin/python bench/bench_history.py [--blocks 2000] [--runs 150]
A/B: run it with ``PYTHONPATH=<other checkout>`` too, interleaved; compare the mins.
"""

from __future__ import annotations

import argparse
import statistics
import time

from contemplation.prompt.prompts import history_blocks
from contemplation.protocol.logformat import header, marker
from contemplation.protocol.parser import parse
from contemplation.values import MarkerKind


def log_text(blocks: int) -> bytes:
    parts: list[str] = []
    for i in range(blocks // 2):
        parts.append(header("CLAUDE", "OLLAMA") + f"question {i}\n")
        reply = header("OLLAMA", "CLAUDE") + f"answer {i} with some words\n"
        if i % 10 == 9:
            reply += marker(MarkerKind.CANCELLED, "the turn was cancelled by the agent")
        elif i % 7 == 6:  # `continue`: the next reply carries on from this one
            reply += marker(MarkerKind.GO_ON)
            reply += "\n" + header("OLLAMA", "CLAUDE") + "and the rest of it\n"
        parts.append(reply)
    return "\n".join(parts).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=150)
    a = ap.parse_args()
    blocks = tuple(parse(log_text(a.blocks)).blocks)
    times: list[float] = []
    made = 0
    for _ in range(a.runs):
        t0 = time.perf_counter()
        made = len(history_blocks(blocks))
        times.append((time.perf_counter() - t0) * 1000)
    print(
        f"history_blocks over {len(blocks)} blocks: min {min(times):.2f} ms, "
        f"p50 {statistics.median(times):.2f} ms ({made} messages, {a.runs} runs)"
    )


if __name__ == "__main__":
    main()
