"""Search by meaning at 10,000 conversations: query p50 / p99 as the faces run
them (``fusion.search`` in meaning and both modes: the index brought up to date, the query
embedded on the model's one thread, brute-force cosine over every vector, the hits read), the
first query of a process (the matrix read from the index), ``reindex`` time (the words'
rebuild measured; the embedding measured on a sample and scaled) and peak memory.

The conversations are folders made by hand with realistic exchanges (a problem and its fix,
drawn from templates). Embedding all 10,000 at about 20 texts a second on 2 cores would take
minutes, so ``--sample`` distinct texts are embedded for real (cached under the temp dir
between runs) and each conversation's vector is a mix of two of them plus noise, written
straight into the index's vectors table: the ranking work is the same as for real vectors.

Run: .venv/bin/python bench/bench_semantic.py [--convs 10000] [--queries 100] [--sample 300]
Targets: query p50 <= 100 ms, p99 <= 300 ms at 10,000 conversations.

Ranking step alone: .venv/bin/python bench/bench_semantic.py --rank-ab [--convs 10000]: CPU
time of ``semantic.rank`` over the same planted vectors with each vector's crowd taken from its
score and without (crowds of 0: the ranking before), interleaved; and the crowds' cost when
the matrix is read (once a process, and again after the vectors changed).

Whole CLI calls: .venv/bin/python bench/bench_semantic.py --cli 20 [--convs 10000]: each
search a new ``contemplation search --all --mode meaning`` process (as a person's shell or an
agent runs it) over the planted home, with the crowds kept in the index and with none kept
(computed when the process reads the vectors, as an index an older version made),
interleaved; CPU ms (user + system, the child's own) and wall ms per call, p50 and p99.

Quality: .venv/bin/python bench/bench_semantic.py --quality [--crowd N] [--embed-url URL
--embed-model M --embed-api ollama|openai]: recall@1, recall@3 and MRR per mode on the
labelled set (tests/system/semantic_set.py: 36 conversations, 100 queries, 36 of them hard
paraphrases that share no word with their conversation), each set also in its two halves by
the query's place in the set (even: the half the ranking's constants were tuned on; odd:
held out). ``--crowd N`` adds N conversations made from the templates above (a problem and
its fix, many alike), embedded for real: the labelled ones must still be found among them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turnbench import percentile  # noqa: E402
from contemplation.errors import InputRejected  # noqa: E402
from contemplation.index import db as index_db  # noqa: E402
from contemplation.index import embedder, fusion, pending, semantic, served  # noqa: E402
from contemplation.index import search as search_index  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402

THINGS = [
    "the daemon",
    "the reply file",
    "the nightly backup",
    "the docker image",
    "the test suite",
    "the web dashboard",
    "the database migration",
    "the GPU training job",
    "the DNS record",
    "the TLS certificate",
    "the systemd unit",
    "the git branch",
    "the CSV import",
    "the cache",
    "the websocket feed",
    "the login form",
    "the rate limiter",
    "the cron job",
    "the API client",
    "the sourdough loaf",
    "the tomato plants",
    "the espresso shot",
    "the bike chain",
    "the marathon plan",
    "the household budget",
    "the puppy",
    "the solar panels",
]
TROUBLES = [
    "fails after a reboot",
    "is much slower than last week",
    "loses data on a power cut",
    "uses more memory every hour",
    "shows the wrong time since the clock change",
    "returns errors under load",
    "works locally but not on the server",
    "got twice as big",
    "stops after exactly sixty seconds",
    "garbles accented names",
    "was fine until the upgrade",
    "runs out of space",
    "needs a cleaner design",
    "keeps retrying forever",
]
FIXES = [
    "write to a temporary name, fsync and rename it",
    "add a bounded queue with backpressure",
    "pin the dependency and rebuild",
    "store times in UTC and convert for display",
    "raise the timeout and send keepalives",
    "poll with a timeout instead of sleeping",
    "use a multi-stage build",
    "add an index on the lookup column",
    "rotate the logs daily",
    "cap the cache size",
    "enable the timer so it renews itself",
    "decode the file as UTF-8",
    "back off exponentially with jitter",
    "reduce the batch size and accumulate gradients",
]
QUERIES = [
    "writes that survive a power cut",
    "program keeps eating RAM",
    "wrong hour in the reports",
    "container image far too large",
    "random failures on the build machine",
    "service does not come back after restarting the computer",
    "too many requests error",
    "names with accents look broken",
    "connection drops when idle",
    "disk full of old logs",
]


def text_of(rng: random.Random) -> tuple[str, str, str]:
    thing, trouble, fix = rng.choice(THINGS), rng.choice(TROUBLES), rng.choice(FIXES)
    question = f"{thing.capitalize()} {trouble}. What should we change?"
    answer = f"Most likely {thing} needs this: {fix}. Then watch it for a day and compare."
    return thing.removeprefix("the ").capitalize(), question, answer


def build(home: Path, n: int, seed: int = 11) -> list[str]:
    """Folders made by hand (a topic line in metadata is not needed: the log's exchange)."""
    rng = random.Random(seed)
    texts: list[str] = []
    for i in range(n):
        topic, question, answer = text_of(rng)
        d = home / ("active" if i % 10 == 0 else "completed") / f"conv-{i:05d}"
        (d / "inbox").mkdir(parents=True)
        day = f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}"
        (d / "messages.log").write_text(
            f"=== CLAUDE -> OLLAMA [{day} 10:00:00] ===\n{question}\n\n"
            f"=== OLLAMA -> CLAUDE [{day} 10:00:05] ===\n{answer}\n"
        )
        texts.append(f"{topic}\n{question}\n{answer}")
    return texts


def sample_vectors(texts: list[str], size: int) -> tuple[np.ndarray, float]:
    """``size`` distinct texts embedded for real (cached by their digest); texts a second."""
    distinct = sorted(set(texts))[:size]
    key = hashlib.sha256("\n\0".join(distinct).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"contemplation-bench-semantic-{key}.npz"
    if cache.exists():
        got = np.load(cache)
        return got["vecs"], float(got["rate"])
    t0 = time.perf_counter()
    vecs = np.concatenate([embedder.passages(distinct[i : i + 8]) for i in range(0, size, 8)])
    rate = len(distinct) / (time.perf_counter() - t0)
    np.savez(cache, vecs=vecs, rate=rate)
    return vecs, rate


def plant(home: Home, base: np.ndarray, seed: int = 5) -> int:
    """Vectors for every conversation in the index, as the product makes them: its own
    (two sample vectors mixed, plus noise) and its opening question's (the first of the two
    with another, plus noise)."""
    rng = np.random.default_rng(seed)
    with index_db.opened(home) as conn:
        rows = conn.execute(
            "SELECT id, coalesce(log_key, '') || '|' || coalesce(topic, '') FROM convs"
        ).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        for conv_id, key in rows:
            a, b, c = rng.integers(0, len(base), 3)
            for at, (x, y) in ((semantic.CONV_AT, (a, b)), (semantic.QUESTION_AT, (a, c))):
                v = base[x] + 0.3 * base[y] + rng.normal(0, 0.02, base.shape[1])
                v = (v / np.linalg.norm(v)).astype(np.float16)
                conn.execute(
                    "INSERT OR REPLACE INTO vectors (conv, at, digest, vec) VALUES (?, ?, 'x', ?)",
                    (conv_id, at, v.tobytes()),
                )
            conn.execute(
                "INSERT OR REPLACE INTO vec_done (conv, key) VALUES (?, ?)",
                (conv_id, key + pending.key_tail("")),
            )
        conn.execute("COMMIT")
        return len(rows)


def timed(home: Home, mode: str, queries: int) -> tuple[list[float], int]:
    rng = random.Random(3)
    took: list[float] = []
    hits = 0
    filters = search_index.Filters(archived=True)
    for i in range(queries):
        q = QUERIES[i % len(QUERIES)] + ("" if i < len(QUERIES) else f" {rng.choice(THINGS)}")
        t0 = time.perf_counter()
        page = fusion.search(home, q, filters, 20, mode=mode)
        took.append((time.perf_counter() - t0) * 1000)
        hits += len(page.hits)
    return took, hits


def cli_calls(home: Home, calls: int) -> None:
    """``calls`` CLI searches in new processes with the crowds kept and as many with none
    kept, interleaved: CPU and wall ms each (the child's rusage)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEMPLATION_", "XDG_"))}
    env.update(CONTEMPLATION_HOME=str(home.root), XDG_CONFIG_HOME=str(home.root / "xdg"))
    exe = str(Path(sys.executable).with_name("contemplation"))
    cpu: dict[str, list[float]] = {"crowds kept": [], "none kept": []}
    wall: dict[str, list[float]] = {"crowds kept": [], "none kept": []}
    for i in range(calls):
        for name in ("crowds kept", "none kept"):
            with index_db.opened(home) as conn:
                if name == "crowds kept":
                    semantic.keep_crowds(conn)
                else:
                    conn.execute("DELETE FROM vec_crowds")
            query = QUERIES[i % len(QUERIES)]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(
                [exe, "search", "--all", "--mode", "meaning", "--limit", "20", query],
                env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            wall[name].append((time.perf_counter() - t0) * 1000)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            cpu[name].append(used * 1000)
    load = os.getloadavg()
    print(f"{calls} CLI searches each way, interleaved; load average {load[0]:.1f}")
    for name, c in cpu.items():
        w = wall[name]
        print(f"{name:12s} CPU p50 {percentile(c, 0.5):6.0f} ms  p99 {percentile(c, 0.99):6.0f} "
              f"ms   wall p50 {percentile(w, 0.5):6.0f} ms  p99 {percentile(w, 0.99):6.0f} ms")  # fmt: skip


# -- quality: the labelled set ------------------------------------------------------------


ALL_CONVS = search_index.Filters(archived=True)  # the crowd's are mostly archived


def labelled_home(home: Home) -> dict[str, str]:
    """The labelled set (tests/system/semantic_set.py) as real conversations, embedded;
    conversation id -> label."""
    from tests.system.semantic_set import written

    ids = {cid: label for label, cid in written(home).items()}
    semantic.update(home, None)
    return ids


def scores(home: Home, ids: dict[str, str], mode: str, queries: list[tuple[str, str]]) -> str:
    """recall@1, recall@3 and MRR (over the first 20 hits) of ``queries`` in ``mode``."""
    r1 = r3 = 0
    mrr = 0.0
    for query, want in queries:
        try:
            hits = fusion.search(home, query, ALL_CONVS, limit=20, mode=mode).hits
        except InputRejected:  # a query the words' syntax refuses counts as a miss
            hits = []
        order = list(dict.fromkeys(ids.get(h.conv, h.conv) for h in hits))
        rank = order.index(want) + 1 if want in order else 0
        r1 += rank == 1
        r3 += 0 < rank <= 3
        mrr += 1 / rank if rank else 0.0
    n = len(queries)
    return f"{r1 / n:.2f} | {r3 / n:.2f} | {mrr / n:.2f}"


def halves(
    queries: list[tuple[str, str]], every: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``queries`` split by their place in ``every`` (the whole set): even, odd."""
    place = {q: i for i, q in enumerate(every)}
    even = [q for q in queries if place[q] % 2 == 0]
    return even, [q for q in queries if place[q] % 2]


def quality(server: served.Server | None = None, crowd: int = 0) -> None:
    """The labelled set's figures, with the offline model or ``server``'s, among ``crowd``
    conversations more made from the templates."""
    from tests.system.semantic_set import ALL, HARD, MORE, QUERIES

    embedder.use(server)

    tmp = Path(tempfile.mkdtemp(prefix="bench-semantic-quality-"))
    try:
        home = Home(tmp / "home")
        if crowd:
            build(home.root, crowd)
        ids = labelled_home(home)
        sets: list[tuple[str, list[tuple[str, str]]]] = []
        for label, queries in (("all", ALL), ("paraphrases", QUERIES + MORE), ("hard", HARD)):
            even, odd = halves(queries, ALL)
            sets += [(label, queries), (f"{label} even (tuned)", even), (f"{label} odd", odd)]
        name = embedder.NAME if server is None else server.tag
        print(f"model: {name}; {len(ids)} labelled conversations, {crowd} more from templates")
        print("| mode | queries | n | recall@1 | recall@3 | MRR |")
        print("|---|---|---|---|---|---|")
        for mode in ("words", "meaning", "both"):
            for name, queries in sets:
                print(f"| {mode} | {name} | {len(queries)} | {scores(home, ids, mode, queries)} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rank_ab(convs: int, sample: int, rounds: int = 200) -> None:
    """The ranking step with and without crowds (CPU ms, interleaved), and the crowds' cost."""
    rng = random.Random(11)
    texts = ["\n".join(text_of(rng)) for _ in range(convs)]
    base, _ = sample_vectors(texts, sample)
    mix = np.random.default_rng(5)
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE vectors (conv TEXT, at INTEGER, digest TEXT, vec BLOB)")
    for i in range(convs):
        a, b = mix.integers(0, len(base), 2)
        v = base[a] + 0.3 * base[b] + mix.normal(0, 0.02, base.shape[1])
        blob = (v / np.linalg.norm(v)).astype(np.float16).tobytes()
        conn.execute("INSERT INTO vectors VALUES (?, -1, 'x', ?)", (f"c{i}", blob))
    queries = [embedder.query(q) for q in QUERIES]
    t0 = time.process_time()
    table = semantic._matrix(conn)  # the crowds computed here
    read_ms = (time.process_time() - t0) * 1000
    t0 = time.process_time()
    semantic.crowds(table.mat, table.codes)
    crowd_ms = (time.process_time() - t0) * 1000
    flat = dataclasses.replace(table, crowd=np.zeros_like(table.crowd))
    took: dict[str, list[float]] = {"without crowds": [], "with crowds": []}
    key = next(iter(semantic._cache))
    for i in range(rounds):
        for name, t in (("without crowds", flat), ("with crowds", table)):
            semantic._cache[key] = t
            t0 = time.process_time()
            semantic.rank(conn, queries[i % len(queries)], depth=200)
            took[name].append((time.process_time() - t0) * 1000)
    print(f"{convs} vectors; matrix read with crowds {read_ms:.0f} ms CPU, of which crowds "
          f"{crowd_ms:.0f} ms")  # fmt: skip
    for name, ms in took.items():
        print(f"rank {name}: p50 {percentile(ms, 0.5):.2f} ms, p99 {percentile(ms, 0.99):.2f} "
              f"ms CPU ({rounds} queries)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument(
        "--quality", action="store_true", help="recall@1, recall@3, MRR on the labelled set"
    )
    ap.add_argument("--rank-ab", action="store_true", help="the ranking step, crowds or not")
    ap.add_argument("--cli", type=int, default=0, help="N whole CLI searches, crowds kept or not")
    ap.add_argument("--crowd", type=int, default=0, help="--quality among N templated more")
    ap.add_argument("--embed-url", default="", help="--quality with this embedding server")
    ap.add_argument("--embed-model", default="", help="its model")
    ap.add_argument("--embed-api", choices=served.APIS, default="ollama", help="its API")
    args = ap.parse_args()
    if not embedder.available():
        sys.exit(embedder.MISSING)
    if args.rank_ab:
        rank_ab(args.convs, args.sample)
        return
    if args.quality:
        url, model, api = args.embed_url, args.embed_model, args.embed_api
        quality(served.Server(url, model, api) if url else None, args.crowd)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-semantic-"))
    try:
        home = Home(tmp / "home")
        texts = build(home.root, args.convs)
        t0 = time.perf_counter()
        index_db.rebuild(home)
        words_s = time.perf_counter() - t0
        base, rate = sample_vectors(texts, args.sample)
        planted = plant(home, base)
        print(
            f"{planted} conversations ({args.convs // 10} active), {args.sample} texts "
            f"embedded for real at {rate:.1f} texts/s (one thread)"
        )
        print(
            f"reindex: words {words_s:.1f} s; embedding {planted} conversation texts at that "
            f"rate: {planted / rate:.0f} s (scaled); in the daemon, in slices of "
            f"{semantic.UPDATE_SECONDS:g} s"
        )
        t0 = time.perf_counter()
        fusion.search(home, "warm up", search_index.Filters(archived=True), 20, mode="meaning")
        cold = (time.perf_counter() - t0) * 1000
        print(f"first query of a process (model load, matrix read): {cold:.0f} ms")
        if args.cli:
            cli_calls(home, args.cli)
            return
        for mode in ("meaning", "both", "words"):
            took, hits = timed(home, mode, args.queries)
            p50, p99 = percentile(took, 0.5), percentile(took, 0.99)
            ok = "ok" if p50 <= 100 and p99 <= 300 else "OVER"
            print(
                f"{mode:8s} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  ({hits / len(took):.0f} "
                f"hits a query)  target p50<=100 p99<=300: {ok}"
            )
        with sqlite3.connect(index_db.db_path(home)) as conn:
            nvec = conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"vectors {nvec} ({nvec * embedder.DIM * 2 / 1e6:.1f} MB float16 in the index, "
            f"{nvec * embedder.DIM * 4 / 1e6:.1f} MB float32 in memory); peak RSS {rss:.0f} MB"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
