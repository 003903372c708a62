"""The ``<think>`` splitter: the same content and thinking however the text is split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contemplation.backends.thinking import ThinkSplitter
from tests.unit.examples import examples


def run(chunks: list[str]) -> tuple[str, str]:
    s = ThinkSplitter()
    pieces = [p for c in chunks for p in s.feed(c)] + s.flush()
    content = "".join(t for k, t in pieces if k == "content")
    thinking = "".join(t for k, t in pieces if k == "thinking")
    return content, thinking


def test_a_think_block_is_split_from_the_answer_and_its_layout_dropped() -> None:
    assert run(["<think>\nI should add.\n</think>\n\nThe sum is 4."]) == (
        "The sum is 4.",
        "I should add.\n",
    )


def test_tags_split_at_every_character_give_the_same_result() -> None:
    text = "<think>hmm</think>answer"
    assert run(list(text)) == ("answer", "hmm")


def test_a_partial_tag_at_the_end_is_text_after_all() -> None:
    assert run(["a <thi"]) == ("a <thi", "")
    assert run(["<think>unfinished </thi"]) == ("", "unfinished </thi")


def test_text_that_only_looks_like_a_tag_is_kept() -> None:
    assert run(["x < y and <b>bold</b> <thinker>"]) == ("x < y and <b>bold</b> <thinker>", "")


def test_reset_forgets_an_open_block() -> None:
    s = ThinkSplitter()
    s.feed("<think>half a thought")
    s.reset()
    assert s.feed("plain answer") == [("content", "plain answer")]


def test_adjacent_pieces_of_one_kind_are_merged() -> None:
    s = ThinkSplitter()
    assert s.feed("a<think>b</think>c") == [("content", "a"), ("thinking", "b"), ("content", "c")]


_alphabet = st.sampled_from(["<think>", "</think>", "<", ">", "/", "t", "h", "i", "n", "k", " ", "\n", "x", "é"])  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(
    parts=st.lists(_alphabet, max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_split_gives_the_same_content_and_thinking(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    points = sorted({c % (len(text) + 1) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert "".join(chunks) == text
    assert run(chunks) == run([text])


@settings(max_examples=examples(200), deadline=None)
@given(
    thought=st.text(alphabet="abc <>/\n", max_size=30).filter(lambda t: "</think>" not in t),
    answer=st.text(alphabet="abc <>/\n", max_size=30).filter(lambda t: "<think>" not in t),
)
def test_thinking_and_answer_come_back_whole(thought: str, answer: str) -> None:
    content, thinking = run([f"<think>{thought}</think>{answer}"])
    assert thinking == thought.lstrip()
    assert content == answer.lstrip()
