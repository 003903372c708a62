"""What watching a reply for loops costs per streamed token (issue 45, finding 1).

Run: .venv/bin/python bench/bench_repetition.py [--chars 2000000] [--token 4]

Honest text (the standard library's own Python files, read now) is fed to
:class:`contemplation.protocol.repetition.Watch` in pieces of ``--token`` characters, as a
model streams it; the same pieces are also only joined (what the reply's writer does with
each piece anyway, at the least). Prints the cost per token (mean, p50, p99, max, in µs),
the ratio to the join alone, and what share of one token's time it is at 100 tokens/s (a
fast GPU) and at 1,000 tokens/s. Also: how many characters a loop runs before it is seen.
"""

from __future__ import annotations

import argparse
import statistics
import sysconfig
import time
from pathlib import Path

from contemplation.protocol.repetition import Watch


def honest(chars: int) -> str:
    out: list[str] = []
    n = 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = f.read_text(errors="replace")
        out.append(text)
        n += len(text)
        if n >= chars:
            break
    return "".join(out)[:chars]


def per_token(pieces: list[str], watch: Watch | None) -> list[float]:
    times: list[float] = []
    kept: list[str] = []
    clock = time.perf_counter_ns
    for p in pieces:
        t0 = clock()
        kept.append(p)
        if watch is not None and watch.feed(p) is not None:
            raise SystemExit("a false loop in honest text")
        times.append((clock() - t0) / 1000)
    return times


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=2_000_000)
    ap.add_argument("--token", type=int, default=4)
    a = ap.parse_args()
    text = honest(a.chars)
    pieces = [text[i : i + a.token] for i in range(0, len(text), a.token)]
    base = per_token(pieces, None)
    watched = per_token(pieces, Watch())
    mb, mw = statistics.fmean(base), statistics.fmean(watched)
    print(f"{len(pieces):,} tokens of {a.token} characters ({len(text):,} characters of stdlib)")
    print(f"join only:   mean {mb:.3f} µs  p50 {pct(base, 0.5):.3f}  p99 {pct(base, 0.99):.3f}")
    print(
        f"with Watch:  mean {mw:.3f} µs  p50 {pct(watched, 0.5):.3f}  "
        f"p99 {pct(watched, 0.99):.3f}  max {max(watched):.1f}"
    )
    extra = mw - mb
    print(f"ratio {mw / mb:.1f}x; extra {extra:.3f} µs a token = "
          f"{extra / 10_000 * 100:.4f}% of a token at 100 tok/s, "
          f"{extra / 1_000 * 100:.3f}% at 1,000 tok/s")  # fmt: skip
    loop = "In one sentence: Contemplation is" + " and a data warehouse" * 500
    w = Watch()
    seen = next(i for i in range(0, len(loop), a.token) if w.feed(loop[i : i + a.token]))
    print(f"the README's loop is stopped {seen + a.token - 33} characters into the loop")


if __name__ == "__main__":
    main()
