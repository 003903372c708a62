"""Pure token budgeting: estimate, calibrate, and compact the oldest turns with a note."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contemplation import budget
from contemplation.models import ChatMessage, ChatRequest


def convo(turns: int, size: int = 400) -> list[ChatMessage]:
    msgs = [ChatMessage("system", "You are helpful.")]
    for i in range(turns):
        msgs.append(ChatMessage("user", f"question {i} " + "q" * size))
        msgs.append(ChatMessage("assistant", f"answer {i} " + "a" * size))
    return msgs


def test_estimate_counts_characters_times_ratio_plus_per_message_overhead() -> None:
    msgs = [ChatMessage("user", "x" * 400)]
    assert budget.estimate(msgs) == 100 + budget.PER_MESSAGE
    assert budget.estimate(msgs, ratio=0.5) == 200 + budget.PER_MESSAGE
    tools = [{"type": "function", "function": {"name": "read_file"}}]
    assert budget.estimate(msgs, tools=tools) > budget.estimate(msgs)


def test_a_history_that_fits_is_unchanged() -> None:
    msgs = convo(3)
    kept, dropped, note = budget.fit(msgs, 8192, reserve=1024)
    assert kept == msgs
    assert (dropped, note) == (0, "")


def test_the_oldest_turns_are_dropped_with_a_note_system_and_newest_kept() -> None:
    msgs = convo(20)  # ~ 20 * 2 * 104 tokens = 4,160
    kept, dropped, note = budget.fit(msgs, 2048, reserve=512)
    assert kept[0] == msgs[0]  # the system prompt stays
    assert kept[-2:] == msgs[-2:]  # the newest turn stays
    assert dropped == len(msgs) - len(kept) and dropped % 2 == 0  # whole turns
    assert kept[1].content.startswith(f"question {dropped // 2} ")  # the oldest went first
    assert budget.estimate(kept) <= 2048 - 512
    window = "to fit the model's context window (2048 tokens)"
    assert note == f"{dropped} earlier message(s) were left out {window}"


def test_a_summary_stands_in_for_the_dropped_turns() -> None:
    msgs = convo(20)
    _, dropped, _ = budget.fit(msgs, 2048, reserve=512)
    old = budget.dropped_messages(msgs, dropped)
    assert old == msgs[1 : 1 + dropped]
    request = budget.summary_request("llama3.2", old)
    assert "question 0" in request.messages[0].content and request.model == "llama3.2"
    kept, dropped2, note = budget.fit(msgs, 2048, reserve=512, summary="They discussed q and a.")
    assert kept[1].role == "system"
    assert kept[1].content.startswith(budget.SUMMARY_PREFIX)
    assert "They discussed q and a." in kept[1].content
    assert dropped2 >= dropped
    assert "summarised" in note
    assert budget.estimate(kept) <= 2048 - 512


def test_when_even_the_newest_turn_is_too_big_the_note_says_so() -> None:
    msgs = [ChatMessage("system", "s"), ChatMessage("user", "x" * 40_000)]
    kept, dropped, note = budget.fit(msgs, 4096, reserve=512)
    assert kept == msgs and dropped == 0
    assert "still larger than the window" in note


def test_fit_request_counts_the_tool_definitions() -> None:
    msgs = convo(6)
    tools = tuple(
        {"type": "function", "function": {"name": f"t{i}", "description": "d" * 400}}
        for i in range(10)
    )
    request = ChatRequest(model="m", messages=tuple(msgs), tools=tools)
    plain, d1, _ = budget.fit_request(
        ChatRequest(model="m", messages=tuple(msgs)), 2048, reserve=256
    )
    with_tools, d2, _ = budget.fit_request(request, 2048, reserve=256)
    assert d2 > d1
    assert with_tools.tools == tools and plain.messages == tuple(msgs)


def test_calibration_learns_a_ratio_per_model_and_ignores_implausible_samples() -> None:
    cal = budget.Calibration(weight=0.5)
    msgs = [ChatMessage("user", "x" * 4000)]
    assert cal.ratio("m") == budget.DEFAULT_RATIO
    first = cal.observe("m", msgs, 1600 + budget.PER_MESSAGE)  # 0.4 tokens a character
    assert first == 0.4
    second = cal.observe("m", msgs, 2400 + budget.PER_MESSAGE)  # 0.6: halfway there
    assert second == 0.5
    assert cal.observe("m", msgs, 10) == 0.5  # a cache-reuse count: ignored
    assert cal.observe("m", [ChatMessage("user", "hi")], 100) == 0.5  # too little text
    assert cal.ratio("other") == budget.DEFAULT_RATIO


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=30),
    window=st.integers(min_value=600, max_value=8192),
)
def test_fit_never_exceeds_the_budget_unless_only_the_newest_turn_is_left(
    sizes: list[int], window: int
) -> None:
    msgs = [ChatMessage("system", "sys")]
    for i, n in enumerate(sizes):
        msgs.append(ChatMessage("user" if i % 2 == 0 else "assistant", "y" * n))
    kept, dropped, note = budget.fit(msgs, window, reserve=256)
    assert len(kept) + dropped == len(msgs)
    assert kept[0].role == "system" and kept[-1] == msgs[-1]
    if budget.estimate(kept) > window - 256:
        assert "still larger" in note
        assert [m for m in kept if m.role == "user"][:1] == [m for m in msgs if m.role == "user"][
            -1:
        ]
