"""The pure core (contemplation/protocol/conversation.py): what a conversation needs next, from its
parsed log alone. Logs are written as text, parsed, and asked."""

from __future__ import annotations

from contemplation.models import Block, MarkerKind
from contemplation.protocol.conversation import (
    DISOWNED,
    answered_by_hand,
    need_id,
    need_rounds,
    next_action,
    still_due,
    turn_start,
    unanswered,
)
from contemplation.protocol.logformat import header, marker, timestamp
from contemplation.protocol.parser import parse

TS = timestamp()  # the format the writer uses


def agent(text: str) -> str:
    return header("CLAUDE", "OLLAMA", TS) + text + "\n\n"


def model(text: str, *marks: MarkerKind) -> str:
    return header("OLLAMA", "CLAUDE", TS) + text + "\n" + "".join(marker(k) for k in marks) + "\n"


def answer(need: str, text: str) -> str:
    return agent(f"RESPONSE TO NEED: {need}\n{text}")


def blocks(*parts: str) -> tuple[Block, ...]:
    result = parse("".join(parts).encode())
    assert result.errors == ()
    return result.blocks


def test_an_empty_log_is_idle_and_an_agent_message_is_a_turn() -> None:
    assert next_action(()).action == "idle"
    log = blocks(agent("hello"))
    assert next_action(log).action == "turn" and still_due(log)


def test_a_plain_reply_leaves_the_conversation_idle() -> None:
    nxt = next_action(blocks(agent("hello"), model("hi there")))
    assert (nxt.action, nxt.reason) == ("idle", "answered")


def test_complete_ends_the_conversation() -> None:
    assert next_action(blocks(agent("hello"), model("done", MarkerKind.COMPLETE))).action == (
        "complete"
    )


def test_needs_are_due_until_every_one_is_answered_then_the_model_is_called() -> None:
    asked = (agent("plan?"), model("Let me look.\nNEED: File contents of a.md\nNEED: The time"))
    nxt = next_action(blocks(*asked))
    assert nxt.action == "needs" and nxt.needs == ("File contents of a.md", "The time")
    assert nxt.rounds == 1
    one = blocks(*asked, answer("The time", "10:00"))
    assert next_action(one).needs == ("File contents of a.md",)
    both = blocks(*asked, answer("The time", "10:00"), answer("File contents of a.md", "# A"))
    assert next_action(both).action == "turn"


def test_a_need_asked_twice_in_one_reply_is_due_once() -> None:
    log = blocks(agent("q"), model("NEED: The time\nNEED: The time"))
    assert unanswered(log)[1] == ("The time",)


def test_a_cut_reply_is_redone_and_a_stopped_one_waits_for_the_agent() -> None:
    cut = blocks(agent("q"), model("half an ans", MarkerKind.INTERRUPTED))
    assert next_action(cut).action == "turn"
    for kind in (MarkerKind.ERROR, MarkerKind.CANCELLED):
        stopped = next_action(blocks(agent("q"), model("", kind)))
        assert (stopped.action, stopped.reason) == ("stopped", kind.value.lower())
    # the agent writing again starts a new turn
    assert next_action(blocks(agent("q"), model("", MarkerKind.ERROR), agent("again"))).action == (
        "turn"
    )


def test_a_cut_reply_is_not_the_one_whose_needs_are_answered() -> None:
    """NEED lines in an interrupted reply are not asked: the last whole reply's are."""
    log = blocks(
        agent("q"),
        model("NEED: The time"),
        answer("The time", "10:00"),
        model("NEED: Something else", MarkerKind.INTERRUPTED),
    )
    block, missing = unanswered(log)
    assert block is not None and block.needs == ("The time",) and missing == ()


def test_rounds_and_the_turn_start_count_from_the_agents_own_message() -> None:
    parts = [agent("first"), model("ok"), agent("second")]
    parts += [model("NEED: A"), answer("A", "a"), model("NEED: B"), answer("B", "b")]
    log = blocks(*parts)
    assert need_rounds(log) == 2
    assert turn_start(log) == log[2].offset  # "second", not the answers after it
    assert turn_start(()) == 0


def test_a_need_id_is_stable_per_reply_and_new_when_asked_again() -> None:
    log = blocks(
        agent("q"), model("NEED: The time"), answer("The time", "10"), model("NEED: The time")
    )
    first, again = log[1], log[3]
    assert need_id(first, "The time") == need_id(first, "The time")
    assert need_id(first, "The time") != need_id(again, "The time")
    assert len(need_id(None, "x")) == 12


def test_a_lookup_held_for_approval_is_answered_by_no_agent_block() -> None:
    """A RESPONSE TO NEED block for a lookup waiting for approval (``held``) is no
    answer; the NOTE the daemon writes after it keeps it so once the lookup is decided, and
    the tool's answer after the NOTE counts."""
    asked = (agent("plan?"), model("NEED: File contents of s.md\nNEED: The time"))
    reply = blocks(*asked)[-1]
    rid = need_id(reply, "File contents of s.md")
    hand = (*asked, answer("File contents of s.md", "made up"), answer("The time", "noon"))
    assert still_due(blocks(*hand))  # nothing held: the hand answer counts
    held = {rid}
    nxt = next_action(blocks(*hand), held)
    assert (nxt.action, nxt.needs) == ("needs", ("File contents of s.md",))
    assert not still_due(blocks(*hand), held)
    assert answered_by_hand(blocks(*hand), held) == [(rid, "File contents of s.md")]
    noted = (*hand, marker(MarkerKind.NOTE, f"{DISOWNED} {rid}: it waits for approval") + "\n")
    # decided now (held no more), the NOTE still voids the hand answer, and only that one
    assert next_action(blocks(*noted)).needs == ("File contents of s.md",)
    assert answered_by_hand(blocks(*noted), held) == []
    tool = (*noted, answer("File contents of s.md", "(source: files.read, …)\nthe real text"))
    assert still_due(blocks(*tool))
    # a plain message instead of a decision is the next turn, as before
    assert still_due(blocks(*hand, agent("never mind")), held)
