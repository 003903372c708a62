"""What watching a reply for loops costs per streamed token, what it wrongly stops and how
soon it stops a real loop, with the rules before honest repetition was told from a loop
(``repetition.BEFORE``: every span stopped after 600 characters and 3 repeats) and now.

Run: .venv/bin/python bench/bench_repetition.py [--chars 2000000] [--token 4]

Honest text (the standard library's own Python files, read now) is fed to
:class:`contemplation.protocol.repetition.Watch` in pieces of ``--token`` characters, as a
model streams it; the same pieces are also only joined (what the reply's writer does with
each piece anyway, at the least). Prints the cost per token (mean, p50, p99, max, in µs),
the ratio to the join alone, and what share of one token's time it is at 100 tokens/s (a
fast GPU) and at 1,000 tokens/s. Then, over tests/repetition_corpus.py (honest structured
answers that repeat exactly, and loops: scripted, SmolLM2's, and loops of data), before and
now: the false-positive rate (honest answers stopped) and the detection delay (characters
a loop runs before it is stopped).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.protocol.repetition import BEFORE, Rules, Watch, shape  # noqa: E402
from tests import repetition_corpus  # noqa: E402


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


NOW: Rules | None = None  # the rules as they are now (Watch's defaults)


def watcher(rules: Rules | None) -> Watch:
    return Watch() if rules is None else Watch(**rules)


def cut_at(text: str, watch: Watch, token: int) -> int | None:
    """Where ``text``, fed in pieces of ``token`` characters, is stopped (None: never)."""
    for i in range(0, len(text), token):
        if watch.feed(text[i : i + token]) is not None:
            return min(len(text), i + token)
    return None


def corpus(token: int) -> None:
    honest = repetition_corpus.honest()
    print(f"\nfalse positives over {len(honest)} honest answers (tests/repetition_corpus.py):")
    for label, rules in (("before", BEFORE), ("now", NOW)):
        stopped = {n: at for n, t in honest.items() if (at := cut_at(t, watcher(rules), token))}
        print(
            f"  {label:6} {len(stopped)}/{len(honest)} stopped ({len(stopped) / len(honest):.0%})"
        )
        for n, at in stopped.items():
            print(f"           {n}: at character {at}")
    print("\ndetection delay: characters of the loop before it is stopped (before -> now)")
    for loop in repetition_corpus.loops():
        into = []
        for rules in (BEFORE, NOW):
            at = cut_at(loop.text, watcher(rules), token)
            into.append("never" if at is None else f"{at - len(loop.start):,}")
        kind = shape(loop.span)
        print(f"  {loop.name:40} {kind:5} period {len(loop.span):3}: {into[0]:>6} -> {into[1]:>6}")
    print("SmolLM2-135M's recorded loops (tests/repetition_smollm2.json): character of the reply")
    for name, text in repetition_corpus.smollm2()["loops"].items():
        cut = [cut_at(text, watcher(rules), token) for rules in (BEFORE, NOW)]
        print(f"  {name:40} of {len(text):5,}: {cut[0]!s:>6} -> {cut[1]!s:>6}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=2_000_000)
    ap.add_argument("--token", type=int, default=4)
    a = ap.parse_args()
    text = honest(a.chars)
    pieces = [text[i : i + a.token] for i in range(0, len(text), a.token)]
    base = per_token(pieces, None)
    before = per_token(pieces, Watch(**BEFORE))
    watched = per_token(pieces, Watch())
    mb, mw = statistics.fmean(base), statistics.fmean(watched)
    print(f"{len(pieces):,} tokens of {a.token} characters ({len(text):,} characters of stdlib)")
    print(f"join only:   mean {mb:.3f} µs  p50 {pct(base, 0.5):.3f}  p99 {pct(base, 0.99):.3f}")
    for label, xs in (("rules before", before), ("with Watch", watched)):
        print(
            f"{label + ':':13} mean {statistics.fmean(xs):.3f} µs  p50 {pct(xs, 0.5):.3f}  "
            f"p99 {pct(xs, 0.99):.3f}  max {max(xs):.1f}"
        )
    extra = mw - mb
    print(f"ratio {mw / mb:.1f}x; extra {extra:.3f} µs a token = "
          f"{extra / 10_000 * 100:.4f}% of a token at 100 tok/s, "
          f"{extra / 1_000 * 100:.3f}% at 1,000 tok/s")  # fmt: skip
    loop = "In one sentence: Contemplation is" + " and a data warehouse" * 500
    w = Watch()
    seen = next(i for i in range(0, len(loop), a.token) if w.feed(loop[i : i + a.token]))
    print(f"the README's loop is stopped {seen + a.token - 33} characters into the loop")
    corpus(a.token)


if __name__ == "__main__":
    main()
