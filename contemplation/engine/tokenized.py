"""The token estimate calibrated by the server's own tokenizer, before a turn is fitted.

A turn whose estimated prompt is near or over the window, for a model no server has counted
yet (:mod:`contemplation.prompt.tokencount` decides), has its request's text counted once by
a provider that has a tokenizer (:class:`~contemplation.backends.base.CountsTokens`): one
call, within :data:`WITHIN` seconds, at most ``tokencount.MAX_CHARS`` characters. The model's
ratio becomes the server's, and the turn fits its history to it; a tokenizer that fails or
is late leaves the estimate as it was (the refusal, if the server sends one, still compacts).
"""

from __future__ import annotations

import structlog

from contemplation.backends.base import Backend, CountsTokens
from contemplation.base.aio import on_thread
from contemplation.models import ChatRequest
from contemplation.prompt import tokencount
from contemplation.prompt.budget import Calibration, estimate_request

log = structlog.get_logger("contemplation.tokenized")

WITHIN = 5.0  # seconds the tokenizer gets; the turn waits for it before its slot
ASK_AGAIN = 600.0  # seconds before a tokenizer that failed for a model is asked again
LONG_TEXT = 20_000  # characters above which the text is gathered on a thread


def counter(backends: list[Backend]) -> Backend | None:
    """The first of the turn's providers whose server has a tokenizer."""
    return next((b for b in backends if isinstance(b, CountsTokens)), None)


async def calibrate(
    calibration: Calibration,
    backend: Backend | None,
    model: str,
    request: ChatRequest,
    window: int,
    *,
    now: float,
) -> str | None:
    """Count ``request``'s text with ``backend``'s tokenizer when it is due, and set the
    model's ratio to the count. Returns the NOTE that says so, or None when nothing changed
    (not due, no tokenizer, or it could not say)."""
    if not isinstance(backend, CountsTokens):
        return None
    old = calibration.ratio(model)
    estimated = estimate_request(request, old)
    if not tokencount.due(estimated, window, measured=calibration.measured(model)):
        return None
    asked = calibration.asked.get(model)
    if asked is not None and now - asked < ASK_AGAIN:
        return None
    calibration.asked[model] = now

    def gather() -> str:
        return tokencount.sample(tokencount.request_text(request))

    # (about estimated / old characters: a long history is joined off the loop)
    text = await on_thread(gather) if estimated / old > LONG_TEXT else gather()
    tokens = await backend.count_tokens(text, within=WITHIN)
    if not tokens:
        log.info("tokenizer_unavailable", model=model)
        return None
    ratio = calibration.counted(model, len(text), tokens)
    log.info("tokenizer_calibrated", model=model, tokens=tokens, chars=len(text), ratio=ratio)
    return tokencount.note(model, counted=tokens, chars=len(text), estimated=old, ratio=ratio)
