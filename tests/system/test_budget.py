"""Pure token budgeting: estimate, calibrate, and compact the oldest turns with a note."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from contemplation.models import Block, BlockKind, ChatMessage, ChatRequest, MarkerKind
from contemplation.needs import router
from contemplation.prompt import budget
from contemplation.prompt.prompts import history_blocks
from contemplation.protocol import logformat
from contemplation.protocol.parser import parse


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


def test_when_even_the_newest_turn_is_too_big_the_note_says_so() -> None:
    msgs = [ChatMessage("system", "s"), ChatMessage("user", "x" * 40_000)]
    kept, dropped, note = budget.fit(msgs, 4096, reserve=512)
    assert kept == msgs and dropped == 0
    assert "still larger than the window" in note


def test_the_plan_counts_the_tool_definitions() -> None:
    msgs = convo(6)
    tools = tuple(
        {"type": "function", "function": {"name": f"t{i}", "description": "d" * 400}}
        for i in range(10)
    )
    request = ChatRequest(model="m", messages=tuple(msgs), tools=tools)
    plain = budget.plan(ChatRequest(model="m", messages=tuple(msgs)), 2048, blocks=(), reserve=256)
    with_tools = budget.plan(request, 2048, blocks=(), reserve=256)
    assert len(with_tools.request.messages) < len(plain.request.messages) == len(msgs)
    assert with_tools.request.tools == tools


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


# --------------------------------------------------------------------------- history that fits

TS = "2026-01-19 10:00:00"


def block(kind: BlockKind, text: str, markers: tuple[tuple[MarkerKind, str], ...] = ()) -> Block:
    sender = "CLAUDE" if kind is BlockKind.AGENT else "OLLAMA"
    first_line = text.split("\n", maxsplit=1)[0]
    responds = (first_line[len("RESPONSE TO NEED: ") :],) if text.startswith("RESPONSE TO") else ()
    return Block(
        sender=sender,
        recipient="OLLAMA" if kind is BlockKind.AGENT else "CLAUDE",
        timestamp="2026-01-19 10:00:00",
        kind=kind,
        text=text,
        offset=0,
        end=0,
        response_to=responds[0] if responds else None,
        responds=responds,
        markers=markers,
    )


def tool_answer(need: str, body: str) -> str:
    return router.Answer(
        tool="files.read", time=TS, content=body, origin="/notes/x.md"
    ).render_block(need)


def request_of(blocks: list[Block], system: str = "You are helpful.") -> ChatRequest:
    msgs = [ChatMessage("system", system), *(m for _, m in history_blocks(tuple(blocks)))]
    return ChatRequest(model="m", messages=tuple(msgs), options={"num_ctx": 2048})


def test_a_tool_output_becomes_a_stub_that_names_the_need_to_ask_again() -> None:
    text = tool_answer("File contents of x.md", "line\n" * 300)
    short = budget.stub_tool_output(ChatMessage("user", text))
    assert short is not None and short.role == "user"
    lines = short.content.split("\n")
    assert lines[0] == "RESPONSE TO NEED: File contents of x.md"
    assert lines[1].startswith("(source: files.read, ")
    assert lines[2] == (
        "(tool output left out to fit the context window, 1,500 characters; "
        "to see it again, ask again with the same line: NEED: File contents of x.md)"
    )
    assert lines[3:] == [""] and "line\nline" not in short.content
    # native tool results keep their role and call id
    tool = ChatMessage("tool", text, tool_call_id="call_1", tool_name="read_file")
    stubbed = budget.stub_tool_output(tool)
    assert stubbed is not None and (stubbed.role, stubbed.tool_call_id) == ("tool", "call_1")
    # nothing to stub: a plain message, a refusal, the model's own words
    assert budget.stub_tool_output(ChatMessage("user", "hello")) is None
    refused = router.Answer(
        tool="files.read", time=TS, content="no", status="refused"
    ).render_block("X")
    assert budget.stub_tool_output(ChatMessage("user", refused)) is None
    assert budget.stub_tool_output(ChatMessage("assistant", text)) is None


def test_eviction_stubs_the_oldest_outputs_only_as_far_as_needed_never_the_newest() -> None:
    msgs = [ChatMessage("system", "s")]
    for i in range(3):
        msgs.append(ChatMessage("assistant", f"NEED: File contents of f{i}"))
        msgs.append(ChatMessage("user", tool_answer(f"File contents of f{i}", "z" * 2000)))
    full = budget.estimate(msgs)
    out, n = budget.evict(msgs, full - 100)  # one stub is enough
    assert n == 1 and "left out" in out[2].content and out[4:] == msgs[4:]
    out, n = budget.evict(msgs, 0)  # however small the budget: the newest output stays
    assert n == 2 and out[-1] == msgs[-1] and "left out" in out[4].content
    assert budget.evict(msgs, full) == (msgs, 0)


def test_summary_notes_round_trip_through_the_log_and_the_parser() -> None:
    text = "They chose SQLite. " * 40 + "=== COMPLETE === is not a marker"
    notes = budget.summary_notes(text, 3, "5 message(s) summarised to fit: the window")
    assert len(notes) > 1 and all(len(n) <= budget.NOTE_CHARS for n in notes)
    log = "=== CLAUDE -> OLLAMA [2026-01-19 10:00:00] ===\nq1\n\n"
    log += "=== OLLAMA -> CLAUDE [2026-01-19 10:00:01] ===\na1\n\n"
    log += "=== CLAUDE -> OLLAMA [2026-01-19 10:00:02] ===\nq2\n"
    log += "".join(logformat.marker(MarkerKind.NOTE, n) for n in notes)
    parsed = parse(log.encode())
    assert [b.text for b in parsed.blocks] == ["q1", "a1", "q2"]  # the summary is no message
    saved = budget.read_summary(parsed.blocks)
    assert saved is not None and saved.covers == 0  # the last 3 blocks: all of them
    assert saved.text == budget.cap_summary(text)
    assert "= = =" in saved.text and len(saved.text) <= budget.SUMMARY_MAX_CHARS
    assert budget.read_summary(parsed.blocks[:2]) is None


def _history(turns: int, q: int = 1400, a: int = 800, first: int = 0) -> list[Block]:
    out: list[Block] = []
    for i in range(first, first + turns):
        out.append(block(BlockKind.AGENT, f"question {i} " + "q" * q))
        out.append(block(BlockKind.MODEL, f"answer {i} " + "a" * a))
    return out


def test_a_plan_that_fits_changes_nothing_and_asks_for_no_summary() -> None:
    blocks = _history(2)
    request = request_of(blocks)
    p = budget.plan(request, 8192, blocks=blocks)
    assert p.request == request and p.notes == () and p.summarise == ()


def test_a_plan_over_the_window_asks_for_a_summary_of_the_oldest_turns_and_keeps_the_newest() -> (
    None
):
    blocks = [*_history(4), block(BlockKind.AGENT, "question 4 " + "q" * 1400)]
    request = request_of(blocks)
    p = budget.plan(request, 2048, blocks=blocks, reserve=512)
    assert p.summarise and p.previous is None
    rest = list(request.messages[1:])
    assert list(p.summarise) == rest[: p.left_out] and list(p.kept) == rest[p.left_out :]
    assert p.keep == len(blocks) - p.left_out  # one message per block here
    summary_req = budget.summary_request_for(p)
    ask = summary_req.messages[0].content
    assert budget.estimate(summary_req.messages) <= 2048 - budget.summary_tokens(2048)
    assert "question 0" in ask and f"question {p.left_out // 2}" not in ask
    assert summary_req.options == {"num_ctx": 2048, "num_predict": budget.summary_tokens(2048)}
    final, notes = p.with_summary("Q and A about q and a.")
    assert final.messages[0].content.endswith(f"{budget.SUMMARY_PREFIX}\nQ and A about q and a.")
    assert list(final.messages[1:]) == rest[p.left_out :]
    assert budget.estimate(final.messages) <= 2048 - 512
    assert notes == budget.summary_notes(
        "Q and A about q and a.",
        p.keep,
        f"{p.left_out} message(s) summarised to fit the model's context window (2048 tokens)",
    )
    dropped, notes = p.without_summary("timeout")
    assert list(dropped.messages[1:]) == rest[p.left_out :]
    assert budget.SUMMARY_PREFIX not in dropped.messages[0].content
    assert notes == [
        f"summarising {p.left_out} earlier message(s) failed (timeout); {p.left_out} "
        "message(s) were left out to fit the model's context window (2048 tokens)"
    ]


def test_a_summary_in_the_log_is_reused_and_later_extended_not_redone() -> None:
    blocks = [*_history(4), block(BlockKind.AGENT, "question 4 " + "q" * 1400)]
    first = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    notes = first.with_summary("Earlier: q and a.")[1]
    # the NOTEs land on the last block (the agent's message), the reply follows
    blocks[-1] = replace(blocks[-1], markers=tuple((MarkerKind.NOTE, n) for n in notes))
    blocks += [block(BlockKind.MODEL, "ok"), block(BlockKind.AGENT, "short one")]
    again = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    assert again.summarise == ()  # reused: no call
    assert again.request.messages[0].content.endswith("Earlier: q and a.")
    assert list(again.request.messages[1:]) == [
        *first.kept,
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "short one"),
    ]
    assert again.notes[-1] == (
        f"{first.left_out} earlier message(s) were left out to fit the model's context window "
        "(2048 tokens); the summary above stands in for them"
    )
    # more long turns: a new summary takes in the old one and only what came after it
    blocks += _history(3, first=10)
    blocks.append(block(BlockKind.AGENT, "last " + "q" * 1400))
    later = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    assert later.previous == "Earlier: q and a." and later.summarise
    assert later.summarise[0] == first.kept[0]  # starts where the old summary stopped
    ask = budget.summary_request_for(later).messages[0].content
    assert "SUMMARY OF WHAT CAME BEFORE: Earlier: q and a." in ask and "question 0 " not in ask
    final, notes = later.with_summary("All of it.")
    assert final.messages[0].content.endswith(f"{budget.SUMMARY_PREFIX}\nAll of it.")
    assert "Earlier: q and a." not in final.messages[0].content  # the new one replaces it
    assert list(final.messages[1:]) == list(later.kept)
    assert notes[-1].startswith(
        f"summary of the log before the last {later.keep} block(s) (it takes in the one before "
        f"and {len(later.summarise)} more message(s), to fit the model's context window "
        "(2048 tokens)): All of it."
    )


def test_the_summary_request_fits_its_window_stubbing_outputs_then_leaving_out_the_oldest() -> None:
    blocks: list[Block] = []
    for i in range(8):
        blocks.append(block(BlockKind.MODEL, f"NEED: File contents of f{i}"))
        blocks.append(block(BlockKind.AGENT, tool_answer(f"File contents of f{i}", "z" * 1900)))
    blocks.append(block(BlockKind.MODEL, "done"))
    blocks.append(block(BlockKind.AGENT, "question " + "q" * 4400))
    p = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    assert p.summarise
    ask = budget.summary_request_for(p).messages[0].content
    assert "zzzz" not in ask and "ask again with the same line: NEED: File contents of f0" in ask
    p_small = budget.Plan(
        p.request, summarise=p.summarise * 20, window=2048, ratio=budget.DEFAULT_RATIO
    )
    ask = budget.summary_request_for(p_small).messages[0].content
    assert "earlier message(s) did not fit here and are not shown" in ask
    assert budget.estimate([ChatMessage("user", ask)]) <= 2048 - budget.summary_tokens(2048)


def test_the_reply_reserve_follows_num_predict_and_never_takes_more_than_a_quarter() -> None:
    assert budget.reply_reserve(8192, {}) == 1024
    assert budget.reply_reserve(1024, {}) == 256
    assert budget.reply_reserve(8192, {"num_predict": 300}) == 300
    assert budget.reply_reserve(8192, {"num_predict": -1}) == 1024  # Ollama's "unlimited"
    assert budget.reply_reserve(2048, {"num_predict": 4096}) == 512


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=2500), min_size=1, max_size=16),
    tool_at=st.sets(st.integers(min_value=0, max_value=15)),
    window=st.integers(min_value=1200, max_value=8192),
    summary_len=st.integers(min_value=1, max_value=3000),
)
def test_a_plan_always_ends_with_the_newest_message_and_fits_unless_it_says_otherwise(
    sizes: list[int], tool_at: set[int], window: int, summary_len: int
) -> None:
    blocks = []
    for i, n in enumerate(sizes):
        if i % 2:
            blocks.append(
                block(BlockKind.MODEL, f"NEED: thing {i}" if i + 1 in tool_at else "m" * n)
            )
        elif i in tool_at and i:
            blocks.append(block(BlockKind.AGENT, tool_answer(f"thing {i - 1}", "t" * n)))
        else:
            blocks.append(block(BlockKind.AGENT, "u" * n))
    request = request_of(blocks)
    reserve = budget.reply_reserve(window, {})
    p = budget.plan(request, window, blocks=blocks, reserve=reserve)
    outcomes = [(p.request, list(p.notes))]
    if p.summarise:
        outcomes = [p.with_summary("s " * summary_len), p.without_summary("it failed")]
    for final, notes in outcomes:
        assert final.messages[-1] == request.messages[-1]
        assert final.messages[0].content.startswith("You are helpful.")
        if budget.estimate(final.messages) > window - reserve:
            assert any("still larger than the window" in n for n in notes)
