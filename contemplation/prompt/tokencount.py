"""Pure: what of a request a server's tokenizer is asked to count, when, and the one NOTE.

The estimate (characters times a ratio, see :mod:`contemplation.prompt.budget`) is wrong by
four times for digits, punctuation or CJK text. Where the server has a tokenizer (llama-server
``POST /tokenize``), a turn whose estimated prompt is near or over the window, for a model the
server has not yet counted, has the request's text counted once, and the ratio is set to the
server's count before the history is fitted. The NOTE that says so is written once per
conversation and model (:func:`noted` reads the log), not at every turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from contemplation.models import Block, ChatRequest, MarkerKind

# an estimate above this share of the window is worth a count: the default ratio is four
# times too low for digits and nearly six times for CJK (SmolLM2's tokenizer: 1.0 and 1.43
# tokens a character), so a prompt estimated at a fifth of the window may already overflow it
NEAR = 0.2
MAX_CHARS = 200_000  # characters sent to the tokenizer at most (a sample of a longer text)
SLICES = 16  # a longer text is sampled in this many evenly spread slices
NOTE_HEAD = "token estimate calibrated by the server's tokenizer for "


def due(estimated: int, window: int, *, measured: bool) -> bool:
    """Is a count worth one call: the estimate is near or over the window, and no server
    has yet counted this model's prompts."""
    return not measured and window > 0 and estimated > NEAR * window


def request_text(request: ChatRequest) -> str:
    """The characters the estimate counts: the messages, their tool calls, the tools."""
    parts = [m.content for m in request.messages]
    parts += [str(c) for m in request.messages for c in m.tool_calls]
    parts += [str(t) for t in request.tools]
    return "\n".join(parts)


def sample(text: str, cap: int = MAX_CHARS, slices: int = SLICES) -> str:
    """``text`` when it is at most ``cap`` characters, else ``slices`` pieces of it spread
    evenly from its start to its end (``cap`` characters in all): their ratio stands for
    the whole."""
    if len(text) <= cap:
        return text
    size = cap // slices
    step = (len(text) - size) / max(1, slices - 1)
    return "".join(text[int(i * step) : int(i * step) + size] for i in range(slices))


def note(model: str, *, counted: int, chars: int, estimated: float, ratio: float) -> str:
    return (
        f"{NOTE_HEAD}{model}: {counted:,} tokens for {chars:,} characters "
        f"({ratio:.2f} a character; the estimate assumed {estimated:.2f}); "
        "the history is fitted to the server's count"
    )


def is_calibration_note(text: str, model: str) -> bool:
    return text.startswith(f"{NOTE_HEAD}{model}:")


def noted(blocks: Sequence[Block], model: str) -> bool:
    """The conversation's log already says that ``model``'s estimate was calibrated."""
    return any(
        kind is MarkerKind.NOTE and is_calibration_note(text, model)
        for b in blocks
        for kind, text in b.markers
    )
