"""A prompt the server cut is told by its count against ours, not by the window."""

from __future__ import annotations

from dataclasses import replace

from contemplation.models import ChatMessage, ChatRequest, Usage
from contemplation.prompt import truncation
from contemplation.prompt.budget import MIN_KEPT, Calibration

RATIO = 0.25


def request(chars: int) -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=(ChatMessage("system", "s" * 400), ChatMessage("user", "u" * (chars - 400))),
    )


def check(counts: truncation.Counts, usage: Usage, req: ChatRequest, ratio: float = RATIO) -> str:
    return truncation.check(counts, "c", usage, req, ratio)


def test_a_count_of_the_whole_prompt_is_ollamas_openais_or_llama_servers_cache_plus_new() -> None:
    assert truncation.whole_count(Usage(prompt_eval_count=900)) == 900  # Ollama, OpenAI
    llama = Usage(prompt_eval_count=900, cached_tokens=850, computed_tokens=50)
    assert truncation.whole_count(llama) == 900
    assert truncation.whole_count(Usage(cached_tokens=850, computed_tokens=50)) == 900


def test_no_count_or_only_the_evaluated_tokens_is_no_count_of_the_prompt() -> None:
    assert truncation.whole_count(Usage()) is None
    assert truncation.whole_count(Usage(prompt_eval_count=0)) is None  # Ollama: all cached
    # llama-server's prompt_n without cache_n: a cache hit makes it small
    assert truncation.whole_count(Usage(prompt_eval_count=12, computed_tokens=12)) is None


def test_a_count_clearly_below_ours_is_a_cut_with_both_counts_and_is_not_kept() -> None:
    counts = truncation.Counts()
    req = request(8000)  # 2,000 tokens by our count
    assert truncation.sent_tokens(req, RATIO) == 2000
    text = check(counts, Usage(prompt_eval_count=1026, context_window=4096), req)
    assert text.startswith("the server counted 1026 prompt tokens of the ~2000 sent")
    assert "smaller than the one of 4096 tokens asked for" in text
    assert counts.last("c") is None  # the count of what was left: never kept


def test_a_count_near_ours_or_above_is_no_cut_and_is_kept() -> None:
    req = request(8000)
    for counted in (1501, 2000, 2100, 9000):  # the estimate's error room, template tokens
        counts = truncation.Counts()
        assert check(counts, Usage(prompt_eval_count=counted), req) == ""
        last = counts.last("c")
        assert last is not None and last.tokens == counted
    cached = Usage(prompt_eval_count=2010, cached_tokens=1990, computed_tokens=20)
    assert check(truncation.Counts(), cached, req) == ""  # a cache hit, counted whole


def test_a_short_prompt_needs_a_gap_of_tokens_not_only_a_share() -> None:
    req = request(600)  # 150 tokens: a server's 100 is two thirds, but only 50 tokens fewer
    assert check(truncation.Counts(), Usage(prompt_eval_count=100), req) == ""
    assert check(truncation.Counts(), Usage(prompt_eval_count=60), req) != ""  # 90 fewer


def test_our_ratio_is_never_above_a_quarter_a_character() -> None:
    """The model's ratio mixes every conversation's: one of digits makes it high, and a
    conversation of prose beside it counts far fewer a character."""
    req = request(8000)
    assert truncation.sent_tokens(req, 0.9) == 2000
    assert check(truncation.Counts(), Usage(prompt_eval_count=1800), req, ratio=0.9) == ""
    assert truncation.sent_tokens(req, 0.2) == 1600  # a calibrated ratio below it counts


def test_a_request_that_extends_the_last_counts_the_servers_count_plus_the_new_text() -> None:
    counts = truncation.Counts()
    first = request(4000)
    assert check(counts, Usage(prompt_eval_count=4000), first) == ""  # a token a digit
    grown = replace(
        first,
        messages=(
            *first.messages,
            ChatMessage("assistant", "a" * 400),
            ChatMessage("user", "b" * 400),
        ),
    )
    assert truncation.sent_tokens(grown, RATIO, counts.last("c")) == 4000 + 200
    text = check(counts, Usage(prompt_eval_count=2050), grown)  # num_ctx/2 + 2 of 4,096
    assert text.startswith("the server counted 2050 prompt tokens of the ~4200 sent")
    # a compacted request (its history is not the last one's) is counted from its text
    compacted = replace(first, messages=(ChatMessage("system", "s" * 400), grown.messages[-1]))
    assert truncation.sent_tokens(compacted, RATIO, counts.last("c")) == 200


def test_the_last_counts_of_the_most_recent_conversations_are_kept() -> None:
    counts = truncation.Counts()
    req = request(1000)
    for i in range(truncation.KEPT + 5):
        truncation.check(counts, f"c{i}", Usage(prompt_eval_count=250), req, RATIO)
    assert len(counts) == truncation.KEPT
    assert counts.last("c0") is None and counts.last(f"c{truncation.KEPT + 4}") is not None


def test_a_cut_lowers_the_models_window_never_raises_it_nor_below_the_floor() -> None:
    cal = Calibration()
    assert cal.cut("gemma", 4098) == 4098
    assert cal.cut("gemma", 6000) == 4098  # never raised
    assert cal.cut("gemma", 3000) == 3000
    assert cal.cut("gemma", 40) == max(MIN_KEPT, 40) == MIN_KEPT  # a count, not a window
    assert cal.kept == {"gemma": MIN_KEPT} and cal.cut("other", 2000) == 2000
