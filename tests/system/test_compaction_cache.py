"""Compaction that reuses the server's cache. The summary call is the conversation's
own prompt (what the server holds from the turn before) plus one final instruction, so that
only the instruction is prefilled; a transcript in a new prompt recomputed the whole history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contemplation.engine.runtime import Runtime
from contemplation.models import ChatMessage
from contemplation.prompt import budget
from contemplation.prompt.summarise import SUMMARY_ASK
from contemplation.settings import Settings
from contemplation.store.layout import Home
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_history import a, make, q, turn_with


def _held(request: dict[str, Any], reply: str) -> list[dict[str, Any]]:
    """What the server holds after a turn: its prompt, then its reply."""
    return [*request["messages"], {"role": "assistant", "content": reply}]


def test_the_summary_call_is_the_conversations_prompt_plus_one_instruction(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    for i in range(2):
        turn_with(rt, conv, fake_ollama, q(i), Step(text=a(i)))
    summary = "The agent asked about the migration plan; it moves one table at a time."
    turn_with(rt, conv, fake_ollama, q(2), Step(text=summary), Step(text="Reply three."))
    second, call, third = fake_ollama.chat_requests()[1:]
    sent = call["messages"]
    # a prefix of what the server holds (the system prompt, the oldest turn), then the ask
    assert sent[:-1] == _held(second, a(1))[: len(sent) - 1]
    assert [m["content"] for m in sent[1:-1]] == [q(0), a(0), q(1), a(1)]  # what it stands for
    assert sent[-1] == {"role": "user", "content": SUMMARY_ASK.format(words=budget.summary_words(2048))}
    assert call["options"]["num_predict"] == budget.summary_tokens(2048)  # a tenth
    assert [m["content"] for m in third["messages"][1:]] == [q(2)]


def test_a_summary_that_extends_one_starts_with_the_prompt_that_carried_it(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    for i in range(6):
        fake_ollama.default_step = Step(text=a(i))  # the summaries too
        turn_with(rt, conv, fake_ollama, q(i))
    requests = fake_ollama.chat_requests()
    asks = [i for i, r in enumerate(requests) if r["messages"][-1]["content"].startswith("Summ")]
    assert len(asks) == 2
    sent = requests[asks[1]]["messages"]
    # the system prompt with the first summary, as the turn before sent it, then its history
    assert budget.SUMMARY_PREFIX in sent[0]["content"]
    before = requests[asks[1] - 1]  # the turn before, and its reply: what the server holds
    j = int(before["messages"][-1]["content"].split(":")[0].removeprefix("question "))
    assert sent[:-1] == _held(before, a(j))[: len(sent) - 1]
    assert sent[-1] == {"role": "user", "content": SUMMARY_ASK.format(words=budget.summary_words(2048))}


def test_compaction_fits_to_a_low_water_mark_so_the_turns_after_it_need_none(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """A compaction that keeps the history filled to the brim makes the next turn
    compact again, one message at a time (each a new prompt for the server). Fitted to a
    low-water mark, the turns after it grow into the room left before the next one."""
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    for i in range(2):
        turn_with(rt, conv, fake_ollama, q(i), Step(text=a(i)))
    for i in range(2, 6):  # four long turns past the window
        fake_ollama.default_step = Step(text=a(i))  # the summaries too: ~200 tokens each
        turn_with(rt, conv, fake_ollama, q(i))
    requests = fake_ollama.chat_requests()
    asks = [i for i, r in enumerate(requests) if r["messages"][-1]["content"].startswith("Summ")]
    assert len(asks) == 2, asks  # filled to the brim: one a turn from the third on (4)
    # after a compaction the turn keeps only what fits under the low-water mark
    ratio = budget.DEFAULT_RATIO
    low = budget.LOW_WATER * (2048 - budget.reply_reserve(2048, {}))
    for i in asks:
        sent = requests[i + 1]["messages"]
        left = [ChatMessage(m["role"], m["content"]) for m in sent]
        assert budget.estimate(left, ratio) <= low + budget.message_tokens(left[-1], ratio)
