"""The turn's one tokenizer call: asked when due, once, bounded; a failure changes nothing."""

from __future__ import annotations

import asyncio

from contemplation.backends.base import CountsTokens
from contemplation.engine import tokenized
from contemplation.models import ChatMessage, ChatRequest
from contemplation.prompt import budget, tokencount


class Counter:
    """A backend's tokenizer, in process: one token a character, or no answer."""

    name = "llama"

    def __init__(self, *, answers: bool = True) -> None:
        self.answers = answers
        self.asked: list[tuple[int, float]] = []

    async def count_tokens(self, text: str, *, within: float) -> int | None:
        self.asked.append((len(text), within))
        return len(text) if self.answers else None


def request(chars: int) -> ChatRequest:
    return ChatRequest(model="m", messages=(ChatMessage("user", "7" * chars),))


def run(cal: budget.Calibration, counter: object, req: ChatRequest, now: float = 0.0) -> str | None:
    return asyncio.run(
        tokenized.calibrate(cal, counter, "m", req, 2048, now=now)  # type: ignore[arg-type]
    )


def test_a_prompt_near_the_window_is_counted_once_and_the_ratio_is_the_servers() -> None:
    cal, counter = budget.Calibration(), Counter()
    assert isinstance(counter, CountsTokens)
    note = run(cal, counter, request(2000))  # estimated ~504 of 2048
    assert note is not None and tokencount.is_calibration_note(note, "m")
    assert cal.ratio("m") == 1.0 and counter.asked == [(2000, tokenized.WITHIN)]
    assert run(cal, counter, request(2000)) is None  # measured: never asked again
    assert len(counter.asked) == 1


def test_a_small_prompt_is_not_counted() -> None:
    cal, counter = budget.Calibration(), Counter()
    assert run(cal, counter, request(400)) is None and counter.asked == []


def test_a_tokenizer_that_cannot_say_leaves_the_estimate_and_is_not_asked_every_turn() -> None:
    cal, counter = budget.Calibration(), Counter(answers=False)
    assert run(cal, counter, request(4000), now=100.0) is None
    assert cal.ratio("m") == budget.DEFAULT_RATIO and not cal.measured("m")
    assert run(cal, counter, request(4000), now=200.0) is None
    assert len(counter.asked) == 1  # not again until ASK_AGAIN has passed
    run(cal, counter, request(4000), now=100.0 + tokenized.ASK_AGAIN)
    assert len(counter.asked) == 2


def test_a_backend_without_a_tokenizer_is_never_asked() -> None:
    cal = budget.Calibration()
    assert run(cal, object(), request(4000)) is None


def test_the_text_sent_is_capped() -> None:
    cal, counter = budget.Calibration(), Counter()
    run(cal, counter, request(tokencount.MAX_CHARS * 3))
    assert counter.asked[0][0] <= tokencount.MAX_CHARS
