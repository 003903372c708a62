"""The escalation ladder's pure half: a ladder parsed from its config, its marker written and
read back, and the rung a turn runs on, read from the log alone."""

from __future__ import annotations

import pytest

from contemplation.models import Block, BlockKind, MarkerKind
from contemplation.protocol import escalation
from contemplation.protocol.conversation import next_action
from contemplation.protocol.parser import parse


def blocks(log: str) -> tuple[Block, ...]:
    return parse(log.encode()).blocks


def agent(text: str) -> str:
    return f"=== CLAUDE -> SMALL [2026-11-29 05:00:00] ===\n{text}\n\n"


def model(text: str, *markers: str) -> str:
    lines = "".join(f"=== {m} ===\n" for m in markers)
    return f"=== SMALL -> CLAUDE [2026-11-29 05:00:01] ===\n{text}\n{lines}\n"


def test_a_ladder_names_each_rung_kind() -> None:
    lad = escalation.parse(
        ["qwen3:8b", "steady", "alias:coder", "panel:a,b", "agent"],
        aliases={"steady", "coder"},
        own="small",
    )
    assert [(r.name, r.kind, r.models) for r in lad.rungs] == [
        ("qwen3:8b", "model", ("qwen3:8b",)),
        ("steady", "alias", ("steady",)),
        ("alias:coder", "alias", ("coder",)),
        ("panel:a,b", "panel", ("a", "b")),
        ("agent", "agent", ()),
    ]
    assert lad.after(None) == lad.rungs[0] and lad.after("agent") is None
    assert lad.after("nowhere") is None


def test_a_templates_ladder_is_checked_without_the_aliases() -> None:
    lad = escalation.parse(["alias:coder", "steady"], aliases=None)
    assert [r.kind for r in lad.rungs] == ["alias", "model"]  # checked at its turn
    with pytest.raises(escalation.LadderError, match=r"rung 2 .* is not a model name"):
        escalation.parse(["a", "x → y"], aliases=None)


@pytest.mark.parametrize(
    ("cause", "detail", "text"),
    [
        ("loop", "", "stopped repeating itself → qwen3:8b"),
        ("needs", "6 rounds", "hit the need-round limit (6 rounds) → qwen3:8b"),
        ("error", "HTTP 500 (a (nested) detail)", None),
    ],
)
def test_the_marker_reads_back_as_written(cause: str, detail: str, text: str | None) -> None:
    written = escalation.marker_text(cause, "qwen3:8b", detail)
    if text is not None:
        assert written == text
    step = escalation.read(written)
    assert step is not None and (step.cause, step.to) == (cause, "qwen3:8b")


def test_the_rung_due_is_read_from_the_log_sticky_or_for_the_turn() -> None:
    up = f"ESCALATED: {escalation.marker_text('loop', 'qwen3')}"
    log = agent("first") + model("loop loop", up)
    assert escalation.current(blocks(log), sticky=False) == "qwen3"
    assert next_action(blocks(log)).action == "turn"  # the next rung is due
    answered = log + model("fine", "NOTE: " + escalation.answered_note("qwen3", "loop", "small"))
    assert escalation.rung_of(blocks(answered)[-1]) == "qwen3"
    assert next_action(blocks(answered)).action == "idle"
    later = answered + agent("second")
    assert escalation.current(blocks(later), sticky=True) == "qwen3"
    assert escalation.current(blocks(later), sticky=False) is None


def test_the_agents_rung_waits_and_does_not_stay() -> None:
    top = f"ESCALATED: {escalation.marker_text('loop', 'agent')}"
    log = agent("first") + model("loop", f"ESCALATED: {escalation.marker_text('loop', 'qwen3')}")
    log += model("loop again", top)
    nxt = next_action(blocks(log))
    assert (nxt.action, nxt.reason) == ("stopped", "escalated to the agent")
    later = log + agent("try again")
    assert escalation.current(blocks(later), sticky=True) == "qwen3"  # not the agent's


def test_the_failed_reply_and_the_one_it_went_on_with_leave_the_history() -> None:
    from contemplation.prompt.prompts import history_blocks

    up = f"ESCALATED: {escalation.marker_text('length', 'qwen3')}"
    log = agent("List the colours.")
    log += model("Red,", "GO ON: asked by the escalation ladder once")
    log += model(" orange,", up)
    sent = [m.content for _, m in history_blocks(blocks(log))]
    assert sent == ["List the colours."]
    kinds = [b.kind for b in blocks(log)]
    assert kinds == [BlockKind.AGENT, BlockKind.MODEL, BlockKind.MODEL]
    assert blocks(log)[-1].markers[-1][0] is MarkerKind.ESCALATED


# --------------------------------------------------------------------------- a panel rung


@pytest.mark.parametrize(
    ("rung", "why"),
    [
        ("panel:", "a panel is panel:MODEL,MODEL (two at least)"),  # an empty seat list
        ("panel:a,", "a panel is panel:MODEL,MODEL (two at least)"),
        ("panel:a,alias:nope", "seat 2 names no alias 'nope'"),
        ("panel:panel:a,b,c", "seat 1 is a panel; panels do not nest"),
        ("panel:a,agent", "seat 2 is the agent; a seat is a model"),
        ("panel:" + ",".join(f"m{i}" for i in range(9)), "at most 8 seats"),
    ],
)
def test_a_bad_panel_rung_is_refused_in_one_line(rung: str, why: str) -> None:
    with pytest.raises(escalation.LadderError) as err:
        escalation.parse([rung], aliases={"coder"}, own="small")
    assert why in str(err.value) and f"rung 1 ({rung!r})" in str(err.value)


def test_a_panel_rungs_seats_are_models_or_aliases_and_its_name_has_no_spaces() -> None:
    lad = escalation.parse(["panel:qwen3:8b, alias:coder ,coder", "agent"], aliases={"coder"})
    rung = lad.rungs[0]
    assert (rung.name, rung.kind, rung.models, rung.seats) == (
        "panel:qwen3:8b,alias:coder,coder",
        "panel",
        ("qwen3:8b", "coder", "coder"),
        3,
    )
    # a template's ladder is parsed without the aliases: an alias seat is checked at its turn
    assert escalation.parse(["panel:a,alias:nope"], aliases=None).rungs[0].models == ("a", "nope")
    with pytest.raises(escalation.LadderError, match="named twice"):
        escalation.parse(["panel:a,b", "panel:a, b"], aliases=None)


@pytest.mark.parametrize(
    ("answers", "agree", "words"),
    [
        (["Paris.", "paris"], True, "2 of 2 seats gave the same answer"),
        (["Paris.", "Lyon."], False, "2 different answers from 2 seats, no majority"),
        (['{"a": 1, "b": 2}', '{ "b": 2, "a": 1 }'], True, "2 of 2"),
        (["4", "4.0"], False, "2 different answers"),  # JSON values 4 and 4.0 differ as text
        (["yes", "Yes!", "no"], True, "2 of 3 seats"),
        (["a", "b", "c"], False, "3 different answers from 3 seats"),
        (["a", "a", "b", "b"], False, "2 different answers from 4 seats"),  # a tie: no majority
    ],
)
def test_the_vote_wants_a_strict_majority_of_the_same_normalised_answer(
    answers: list[str], agree: bool, words: str
) -> None:
    got = escalation.vote(answers)
    assert got.agree is agree and got.words.startswith(words)


def seat_note(k: int, n: int, model: str) -> str:
    seat = escalation.Seat("panel:a,b", k, n, model)
    return "NOTE: " + escalation.answered_note("panel:a,b", "loop", "small", seat)


def test_a_panel_rungs_turn_is_due_until_every_seat_answered() -> None:
    up = f"ESCALATED: {escalation.marker_text('loop', 'panel:a,b')}"
    log = agent("Capital of France?") + model("loop loop", up)
    assert next_action(blocks(log)).action == "turn"
    one = log + model("Paris.", seat_note(1, 2, "a"))
    assert escalation.seat_of(blocks(one)[-1]) == escalation.Seat("panel:a,b", 1, 2, "a")
    assert escalation.rung_of(blocks(one)[-1]) == "panel:a,b"
    nxt = next_action(blocks(one))
    assert (nxt.action, nxt.reason) == ("turn", "the next seat of the panel rung")
    two = one + model("paris", seat_note(2, 2, "b"))
    assert next_action(blocks(two)).action == "idle"
    # the history: the second seat never sees the first's answer; later turns see one answer
    from contemplation.prompt.prompts import history_blocks

    assert [m.content for _, m in history_blocks(blocks(one))] == ["Capital of France?"]
    later = two + agent("And Italy?")
    said = [m.content for _, m in history_blocks(blocks(later))]
    assert said == ["Capital of France?", "Paris.", "And Italy?"]
    # a panel that went up the ladder: none of its seats' answers
    no = f"ESCALATED: {escalation.marker_text('disagree', 'agent', 'two answers')}"
    gone = one + model("Lyon.", seat_note(2, 2, "b"), no) + agent("Well?")
    assert [m.content for _, m in history_blocks(blocks(gone))] == ["Capital of France?", "Well?"]
