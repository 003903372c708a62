"""Issue 39: compaction that reuses the server's cache. The summary call is the conversation's
own prompt (what the server holds from the turn before) plus one final instruction, so that
only the instruction is prefilled; a transcript in a new prompt recomputed the whole history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contemplation import budget
from contemplation.layout import Home
from contemplation.runtime import Runtime
from contemplation.settings import Settings
from contemplation.summarise import SUMMARY_ASK
from tests.fakes.ollama_server import FakeOllama, Step
from tests.test_history import a, make, q, turn_with


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
    assert [m["content"] for m in sent[1:-1]] == [q(0), a(0)]  # what the summary stands for
    assert sent[-1] == {"role": "user", "content": SUMMARY_ASK.format(words=150)}
    assert call["options"]["num_predict"] == budget.SUMMARY_MAX_TOKENS
    assert [m["content"] for m in third["messages"][1:]] == [q(1), a(1), q(2)]


def test_a_summary_that_extends_one_starts_with_the_prompt_that_carried_it(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    for i in range(2):
        turn_with(rt, conv, fake_ollama, q(i), Step(text=a(i)))
    turn_with(rt, conv, fake_ollama, q(2), Step(text="First summary."), Step(text=a(2)))
    turn_with(rt, conv, fake_ollama, q(3), Step(text="Second summary."), Step(text="Four."))
    requests = fake_ollama.chat_requests()
    third, call = requests[3], requests[4]
    sent = call["messages"]
    assert sent[0]["content"].endswith(f"{budget.SUMMARY_PREFIX}\nFirst summary.")
    assert sent[:-1] == _held(third, a(2))[: len(sent) - 1]
    assert sent[-1]["role"] == "user" and sent[-1]["content"].startswith("Summarise")
