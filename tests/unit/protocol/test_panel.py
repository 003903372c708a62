"""A panel of models in one log (:mod:`contemplation.protocol.panel`): labels, threads, and
whose turn is due, on logs as the writer writes them."""

from __future__ import annotations

import pytest

from contemplation.models import Block
from contemplation.protocol.panel import MAX_MEMBERS, PANEL, due, label_for, members, thread
from contemplation.protocol.parser import parse

T = "[2026-11-28 10:00:00]"


def log(*blocks: str) -> bytes:
    return ("\n".join(blocks) + "\n").encode()


def ask(text: str, to: str = PANEL) -> str:
    return f"=== CLAUDE -> {to} {T} ===\n{text}\n"


def reply(label: str, text: str) -> str:
    return f"=== {label} -> CLAUDE {T} ===\n{text}\n"


def blocks(*parts: str) -> tuple[Block, ...]:
    return parse(log(*parts)).blocks


def test_labels_are_header_words_unique_and_never_the_agents_or_the_panels() -> None:
    assert label_for("qwen3:8b") == "QWEN3_8B"
    assert label_for("llama3.2:1b-instruct-q4_K_M") == "LLAMA3_2_1B_INSTRUCT_Q4_K_M"
    assert label_for("4o-mini") == "M_4O_MINI"
    assert label_for("panel") == "PANEL_2"
    assert label_for("x" * 80) == "X" * 32
    got = members(["gemma", "gemma", "claude", "Gemma"])
    assert [m.label for m in got] == ["GEMMA", "GEMMA_2", "CLAUDE_2", "GEMMA_3"]
    with pytest.raises(ValueError, match="at most"):
        members(["m"] * (MAX_MEMBERS + 1))
    with pytest.raises(ValueError, match="empty"):
        members(["a", " "])


def test_each_member_is_due_in_order_then_the_round_is_over() -> None:
    panel = ["A", "B", "C"]
    b = blocks(ask("Which index?"))
    assert due(b, panel)[0] == "A"
    b = blocks(ask("Which index?"), reply("A", "On email."))
    assert due(b, panel)[0] == "B"
    b = blocks(ask("Which index?"), reply("A", "On email."), reply("B", "Email."))
    who, nxt = due(b, panel)
    assert (who, nxt.action) == ("C", "turn")
    b = blocks(ask("Q"), reply("A", "a"), reply("C", "c"), reply("B", "b"))
    assert due(b, panel) == (None, due(b, panel)[1]) and due(b, panel)[1].action == "idle"


def test_a_members_needs_are_its_own_and_answered_to_it() -> None:
    panel = ["A", "B"]
    b = blocks(ask("Q"), reply("A", "NEED: File contents of plan.md"))
    who, nxt = due(b, panel)
    assert (who, nxt.action) == ("B", "turn")  # B answers meanwhile
    b = blocks(ask("Q"), reply("A", "NEED: File contents of plan.md"), reply("B", "b"))
    who, nxt = due(b, panel)
    assert (who, nxt.action, nxt.needs) == ("A", "needs", ("File contents of plan.md",))
    answered = ask("RESPONSE TO NEED: File contents of plan.md\nthe plan", to="A")
    b = blocks(ask("Q"), reply("A", "NEED: File contents of plan.md"), reply("B", "b"), answered)
    assert [x.text.splitlines()[0] for x in thread(b, "B")] == ["Q", "b"]  # not B's business
    who, nxt = due(b, panel)
    assert (who, nxt.action) == ("A", "turn")
    b = blocks(
        ask("Q"), reply("A", "NEED: File contents of plan.md"), reply("B", "b"), answered,
        reply("A", "a, with the plan"),
    )  # fmt: skip
    assert due(b, panel)[1].action == "idle"


def test_a_cut_reply_is_redone_for_its_member_only() -> None:
    panel = ["A", "B"]
    cut = reply("A", "half") + "=== INTERRUPTED: reply cut off by a restart ===\n"
    b = blocks(ask("Q"), cut, reply("B", "b"))
    who, nxt = due(b, panel)
    assert (who, nxt.action) == ("A", "turn")


def test_a_cancel_stops_the_whole_round_and_the_next_message_starts_one() -> None:
    panel = ["A", "B"]
    cancelled = reply("A", "hal") + "=== CANCELLED: by the agent ===\n"
    b = blocks(ask("Q"), cancelled)
    assert due(b, panel)[1].action == "stopped"
    b = blocks(ask("Q"), cancelled, ask("Again"))
    assert due(b, panel)[0] == "A"


def test_complete_only_when_every_member_says_so() -> None:
    panel = ["A", "B"]
    b = blocks(ask("Q"), reply("A", "done\n=== COMPLETE ==="), reply("B", "more to say"))
    assert due(b, panel)[1].action == "idle"
    b = blocks(
        ask("Q"), reply("A", "done\n=== COMPLETE ==="), reply("B", "me too\n=== COMPLETE ===")
    )
    assert due(b, panel)[1].action == "complete"


def test_a_debate_shows_each_member_the_others_answers_of_the_round_before() -> None:
    panel = ["A", "B"]
    b = blocks(ask("Q1"), reply("A", "a1"), reply("B", "b1"), ask("Q2"))
    plain = thread(b, "A", panel)
    assert [x.text for x in plain] == ["Q1", "a1", "Q2"]
    seen = thread(b, "A", panel, debate=True)
    assert seen[-1].text.startswith("Q2\n\nThe other models of the panel answered")
    assert "[B]\nb1" in seen[-1].text and "a1" not in seen[-1].text
    assert seen[-1].offset == b[-1].offset  # the same block, so need ids do not move
    assert thread(b, "B", panel, debate=True)[-1].text.endswith("[A]\na1")


def test_the_synthesizer_answers_last_and_sees_every_answer_of_its_round() -> None:
    panel = ["A", "B"]
    b = blocks(ask("Q1"), reply("A", "a1"))
    assert due(b, panel, synthesizer="S")[0] == "B"  # not before every member answered
    b = blocks(ask("Q1"), reply("A", "a1"), reply("B", "b1"))
    who, nxt = due(b, panel, synthesizer="S")
    assert (who, nxt.action) == ("S", "turn")
    seen = thread(b, "S", panel, synthesis=True)
    assert [x.kind.value for x in seen] == ["agent"]
    assert "[A]\na1" in seen[0].text and "[B]\nb1" in seen[0].text and "Weigh them" in seen[0].text
    b = blocks(ask("Q1"), reply("A", "a1"), reply("B", "b1"), reply("S", "both fine"))
    assert due(b, panel, synthesizer="S")[1].action == "idle"
    b = blocks(ask("Q1"), reply("A", "a1"), reply("B", "b1"), reply("S", "s"), ask("Q2"))
    assert due(b, panel, synthesizer="S")[0] == "A"
    assert "[A]\na1" not in thread(b, "S", panel, synthesis=True)[-1].text  # its own round's only


def test_the_agents_answer_sent_to_the_panel_reaches_only_the_seat_that_asked() -> None:
    panel = ["A", "B"]
    answer = ask("RESPONSE TO NEED: the budget\n12k")  # `respond` writes to the panel
    b = blocks(ask("Q"), reply("A", "NEED: the budget"), reply("B", "b"), answer)
    assert [x.text.splitlines()[0] for x in thread(b, "B")] == ["Q", "b"]
    assert thread(b, "A")[-1].response_to == "the budget"
    who, nxt = due(b, panel)
    assert (who, nxt.action) == ("A", "turn")
