"""Issue 39: a prompt the server cut is told by its count against ours, not by the window."""

from __future__ import annotations

from contemplation.models import ChatMessage, ChatRequest, Usage
from contemplation.prompt import budget, truncation

RATIO = 0.25


def request(chars: int) -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=(ChatMessage("system", "s" * 400), ChatMessage("user", "u" * (chars - 400))),
    )


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


def test_a_count_clearly_below_ours_is_a_cut_with_both_counts() -> None:
    req = request(8000)  # ~2,000 tokens by our count
    assert truncation.sent_tokens(req, RATIO) == 2000
    text = truncation.cut(Usage(prompt_eval_count=1026, context_window=4096), req, RATIO)
    assert text.startswith("the server counted 1026 prompt tokens of the ~2000 sent")
    assert "smaller than the one of 4096 tokens asked for" in text


def test_a_count_near_ours_or_above_is_no_cut() -> None:
    req = request(8000)
    for counted in (1501, 2000, 2100, 9000):  # the estimate's error room, template tokens
        assert truncation.cut(Usage(prompt_eval_count=counted), req, RATIO) == ""
    cached = Usage(prompt_eval_count=2010, cached_tokens=1990, computed_tokens=20)
    assert truncation.cut(cached, req, RATIO) == ""  # a cache hit, counted whole


def test_a_short_prompt_needs_a_gap_of_tokens_not_only_a_share() -> None:
    req = request(600)  # 150 tokens: a server's 100 is two thirds, but only 50 tokens fewer
    assert truncation.cut(Usage(prompt_eval_count=100), req, RATIO) == ""
    assert truncation.cut(Usage(prompt_eval_count=60), req, RATIO) != ""  # 90 fewer


def test_our_count_takes_the_lower_of_the_models_ratio_and_the_conversations_own() -> None:
    assert truncation.ratio(0.7, None) == 0.25  # never counted: the default
    assert truncation.ratio(0.7, 0.24) == 0.24  # its own prose, beside a model of tables
    assert truncation.ratio(0.3, 0.9) == 0.3  # a planned (tokenizer's) count below its own


def test_a_conversations_own_ratio_is_its_last_count_and_few_are_kept() -> None:
    cal = budget.Calibration()
    msgs = [ChatMessage("user", "x" * 1000)]
    cal.observe("m", msgs, 1000 + budget.PER_MESSAGE, conversation="table")
    cal.observe("m", msgs, 250 + budget.PER_MESSAGE, conversation="prose")
    assert (cal.own("table"), cal.own("prose"), cal.own("other")) == (1.0, 0.25, None)
    assert 0.25 < cal.ratio("m") < 1.0  # the model's mixes both
    for i in range(budget.CONVERSATIONS_KEPT):
        cal.observe("m", msgs, 500, conversation=f"c{i}")
    assert len(cal.by_conversation) == budget.CONVERSATIONS_KEPT
    assert cal.own("table") is None  # the least recent went first
