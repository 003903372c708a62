"""Full-text search over a home of many conversations made by hand: ``reindex`` of
the whole home, then searches p50 / p99 as the CLI runs them (each first brings the index up
to date: one scandir and two stats a folder), a planted word in every conversation found, the
index's size against the text it indexes, and ``list --all`` from the index.

The logs are dated exchanges of prose drawn from a 20,000-word vocabulary (so the index holds
as many distinct terms as real notes would), each conversation with one word of its own.

Run: .venv/bin/python bench/bench_search_index.py [--active 500] [--archived 9500] [--mb 1000]
Targets: search p50 <= 50 ms, p99 <= 200 ms; every planted word found; reindex of
1 GB <= 60 s; index <= 60 % of the text.
"""

from __future__ import annotations

import argparse
import random
import shutil
import string
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turnbench import percentile  # noqa: E402
from contemplation.index import db as index_db  # noqa: E402
from contemplation.index import listing  # noqa: E402
from contemplation.index import search as search_index  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402

ALL = search_index.Filters(archived=True)


def vocabulary(rng: random.Random, n: int = 20_000) -> list[str]:
    return [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(n)
    ]


def paragraphs(rng: random.Random, words: list[str], n: int = 2000) -> list[str]:
    """Prose-like paragraphs (Zipf-ish: common words far more often than rare ones)."""
    weights = [1 / (i + 1) for i in range(len(words))]
    out = []
    for _ in range(n):
        picked = rng.choices(words, weights=weights, k=rng.randint(40, 400))
        lines = [" ".join(picked[i : i + 12]) for i in range(0, len(picked), 12)]
        out.append("\n".join(lines))
    return out


def planted(i: int) -> str:
    return f"zq{i:05d}marker"


def build(home: Path, active: int, archived: int, total_mb: float, seed: int = 7) -> int:
    """Folders made by hand, ``total_mb`` of logs spread over them; the bytes written."""
    rng = random.Random(seed)
    paras = paragraphs(rng, vocabulary(rng))
    per_conv = int(total_mb * 1e6 / max(active + archived, 1))
    written = 0
    n = 0
    for where, count in (("active", active), ("completed", archived)):
        for _ in range(count):
            d = home / where / f"imported-{n:05d}"
            (d / "inbox").mkdir(parents=True)
            parts: list[str] = []
            size = 0
            turn = 0
            while size < per_conv or turn < 2:
                day = f"2025-{1 + n % 12:02d}-{1 + n % 28:02d} {10 + turn % 12:02d}:00:00"
                who = "CLAUDE -> OLLAMA" if turn % 2 == 0 else "OLLAMA -> CLAUDE"
                body = rng.choice(paras)
                if turn == 1:
                    body += f"\nthe word of this one is {planted(n)}"
                block = f"=== {who} [{day}] ===\n{body}\n\n"
                parts.append(block)
                size += len(block)
                turn += 1
            data = "".join(parts).encode()
            (d / "messages.log").write_bytes(data)
            written += len(data)
            n += 1
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--active", type=int, default=500)
    ap.add_argument("--archived", type=int, default=9500)
    ap.add_argument("--mb", type=float, default=1000, help="MB of logs over all conversations")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--keep", help="build the home here and keep it")
    a = ap.parse_args()
    tmp = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="contemplation-search-"))
    home = Home(tmp / "home")
    t0 = time.perf_counter()
    text = build(home.root, a.active, a.archived, a.mb)
    convs = a.active + a.archived
    print(f"home: {a.active} active, {a.archived} archived; {text / 1e6:.0f} MB of logs "
          f"(made in {time.perf_counter() - t0:.0f} s)")
    t0 = time.perf_counter()
    index_db.rebuild(home)
    took = time.perf_counter() - t0
    print(f"reindex: {took:.1f} s ({text / 1e6 / took:.0f} MB/s; target <= 60 s for 1 GB)")
    rng = random.Random(11)
    times: list[float] = []
    missed = 0
    for _ in range(a.runs):
        i = rng.randrange(convs)
        t0 = time.perf_counter()
        hits = search_index.search(home, planted(i), ALL)
        times.append((time.perf_counter() - t0) * 1000)
        missed += [h.conv for h in hits] != [f"imported-{i:05d}"]
    print(
        f"search (a planted word, index brought up to date first): p50 "
        f"{percentile(times, 0.5):.0f} ms, p99 {percentile(times, 0.99):.0f} ms over {a.runs} "
        f"(targets 50 / 200); planted words missed: {missed}"
    )
    common: list[float] = []
    for q in ("the word", "zq0*", '"word of this"', "marker OR word"):
        t0 = time.perf_counter()
        search_index.search(home, q, ALL)
        common.append((time.perf_counter() - t0) * 1000)
    print(f"search (common words, phrases, prefixes): max {max(common):.0f} ms")
    every = [planted(i) for i in range(convs)]
    t0 = time.perf_counter()
    found = sum(
        1 for i, w in enumerate(every) if i % 50 == 0 and search_index.search(home, w, ALL)
    )
    print(f"every 50th planted word: {found} of {len(range(0, convs, 50))} found")
    ls: list[float] = []
    for _ in range(5):
        t0 = time.perf_counter()
        listing.page(home, listing.Query(scope="all"))
        ls.append((time.perf_counter() - t0) * 1000)
    print(f"list --all rows from the index: p50 {percentile(ls, 0.5):.0f} ms")
    size = sum(
        p.stat().st_size for p in home.root.glob(index_db.DB_NAME + "*") if p.is_file()
    )
    print(f"index {size / 1e6:.0f} MB ({100 * size / max(text, 1):.0f} % of the text; target 60)")
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
