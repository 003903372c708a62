"""Full-text search over a home of 500 active and 10,000 archived conversations made by hand
(issue 24): the first search (which builds the derived index), then searches p50 / p99 (each
brings the index up to date first: one scandir and three stats a folder) and the index size.

Run: .venv/bin/python bench/bench_search_index.py [--active 500] [--archived 10000] [--runs 20]
Target (issue 24): search p50 <= 50 ms, p99 <= 200 ms over 10,000 conversations.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_cli import build  # noqa: E402
from bench.turnbench import percentile  # noqa: E402
from contemplation import index_db, search_index  # noqa: E402
from contemplation.layout import Home  # noqa: E402

ALL = search_index.Filters(archived=True)
QUERIES = ("plain", "Answer 42", "question 9999", "blocks", "hold*", '"one per message"')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--active", type=int, default=500)
    ap.add_argument("--archived", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="contemplation-search-"))
    home = Home(tmp / "home")
    build(home.root, a.active, a.archived)
    text = sum(p.stat().st_size for p in home.root.glob("*/*/messages.log"))
    t0 = time.perf_counter()
    search_index.search(home, "folder", ALL)
    first = time.perf_counter() - t0
    times: list[float] = []
    for i in range(a.runs):
        t0 = time.perf_counter()
        search_index.search(home, QUERIES[i % len(QUERIES)], ALL)
        times.append((time.perf_counter() - t0) * 1000)
    size = index_db.db_path(home).stat().st_size
    print(f"home: {a.active} active, {a.archived} archived; {text / 1e6:.1f} MB of logs")
    print(f"first search (builds the index): {first:.2f} s")
    print(
        f"search p50 {percentile(times, 0.5):.0f} ms, p99 {percentile(times, 0.99):.0f} ms "
        "(targets 50 / 200)"
    )
    print(f"index {size / 1e6:.1f} MB ({100 * size / max(text, 1):.0f} % of the text)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
