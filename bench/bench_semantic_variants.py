"""Ranking variants for search by meaning on the labelled set, before any is built: recall@1,
recall@3 and MRR per variant, each set also in its halves by the query's place in the set
(even: the half a variant's constant is chosen on; odd: held out), so a change is kept only
when it helps the held-out half and lowers nothing else.

The variants score a conversation by its vectors as the index has them (made by the real
path: ``semantic.update``), with each vector's crowd as the search takes it, and may add the
conversation's opening question embedded as a *query* (e5's symmetric use: query against
query) with its own crowd among the other questions, at a weight. The search ranks by the
first of these at ``semantic.QUESTION_WEIGHT`` (0.25), with the questions' vectors the index
keeps (``at`` ``semantic.QUESTION_AT``); here they are embedded anew from the set's questions,
as before it was built.

Run: .venv/bin/python bench/bench_semantic_variants.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.index import db, embedder, semantic  # noqa: E402
from contemplation.store.layout import Home  # noqa: E402
from tests.system.semantic_set import ALL, CONVERSATIONS, HARD, written  # noqa: E402

Scores = npt.NDArray[np.float32]


def main() -> None:
    if not embedder.available():
        sys.exit(embedder.MISSING)
    tmp = Path(tempfile.mkdtemp(prefix="bench-semantic-variants-"))
    try:
        home = Home(tmp / "home")
        ids = written(home)
        semantic.update(home, None)
        with db.opened(home) as conn:
            t = semantic._matrix(conn)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    label_of = {cid: label for label, cid in ids.items()}
    labels = [label_of[n] for n in t.names]
    queries = np.stack([embedder.query(q) for q, _ in ALL])
    asked = np.stack([embedder.query(CONVERSATIONS[lab][1]) for lab in labels])
    asked_crowd = semantic.crowds(asked, np.arange(len(labels)))
    hard = np.array([q in HARD for q in ALL])
    even = np.arange(len(ALL)) % 2 == 0

    def best(rows: Scores) -> Scores:
        out = np.full(len(labels), -np.inf, dtype=np.float32)
        np.maximum.at(out, t.codes, rows)
        return out

    def now(i: int) -> Scores:
        return best(t.mat @ queries[i] - t.crowd)

    variants: list[tuple[str, Callable[[int], Scores]]] = [
        ("cosine alone", lambda i: best(t.mat @ queries[i])),
        (f"cosine less {semantic.CROWD_WEIGHT} crowd", now),
    ]

    def with_question(w: float) -> Callable[[int], Scores]:
        def score(i: int) -> Scores:
            out: Scores = now(i) + w * (asked @ queries[i] - semantic.CROWD_WEIGHT * asked_crowd)
            return out

        return score

    for w in (0.25, 0.5, 1.0):
        built = " (the product's)" if w == semantic.QUESTION_WEIGHT else ""
        name = f"that + {w} x question-as-query (less its crowd){built}"
        variants.append((name, with_question(w)))
    print(f"model: {embedder.NAME}; {len(labels)} conversations, {len(ALL)} queries")
    print("| variant | set | r@1 / r@3 / MRR | even (choose) | odd (held out) |")
    print("|---|---|---|---|---|")
    for name, score in variants:
        ranks = []
        for i, (_, want) in enumerate(ALL):
            order = np.argsort(-score(i), kind="stable")
            ranks.append([labels[j] for j in order].index(want) + 1)
        r = np.array(ranks)
        for label, m in (("all", np.ones(len(ALL), dtype=bool)), ("easy", ~hard), ("hard", hard)):
            cells = [_figures(r[m]), _figures(r[m & even]), _figures(r[m & ~even])]
            print(f"| {name} | {label} ({int(m.sum())}) | " + " | ".join(cells) + " |")


def _figures(ranks: npt.NDArray[np.int64]) -> str:
    r1, r3, mrr = (ranks == 1).mean(), (ranks <= 3).mean(), (1 / ranks).mean()
    return f"{r1:.2f} / {r3:.2f} / {mrr:.2f}"


if __name__ == "__main__":
    main()
