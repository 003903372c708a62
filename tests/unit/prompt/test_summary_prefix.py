"""The summary call is always the conversation's own prompt. Where the
messages to summarise are too long for the window (one turn larger than the room left), the
call is their longest run that fits, the rest carried inside the instruction as a transcript:
never a prompt of its own, which would replace the server's cache of the conversation."""

from __future__ import annotations

from contemplation.models import ChatMessage, ChatRequest
from contemplation.prompt import budget
from contemplation.prompt.summarise import REST_HEAD, cached_request


def test_a_history_too_long_for_the_window_is_summarised_from_the_slots_own_prefix() -> None:
    system = ChatMessage("system", "You are a careful assistant. " * 20)
    history = [
        ChatMessage("user" if i % 2 == 0 else "assistant", f"message {i}: " + "word " * 100)
        for i in range(8)
    ]
    request = ChatRequest(model="m", messages=(system, *history), options={"num_ctx": 1024})
    plan = budget.Plan(
        request, summarise=tuple(history), window=1024, ratio=budget.DEFAULT_RATIO,
        system=(system,),
    )  # fmt: skip
    call = cached_request(plan, think=None)
    assert call is not None
    sent = call.messages
    assert sent[0] == system  # the prompt the server holds, from its start
    k = len(sent) - 2
    assert k >= 1 and list(sent[1:-1]) == history[:k]
    ask = sent[-1].content
    assert ask.startswith("Summarise the conversation above") and REST_HEAD in ask
    assert f"message {len(history) - 1}:" in ask  # the newest of them is in the transcript
    bound = budget.summary_tokens(1024)
    assert call.options["num_predict"] == bound
    assert budget.estimate(sent) <= 1024 - bound
