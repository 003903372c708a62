"""Pure: was the reply built on a prompt the server cut? (issue 39, servers that still truncate)

An older Ollama ignores ``"truncate": false`` and cuts a prompt over ``num_ctx`` without a word,
and some OpenAI-compatible servers cut too (llama-server's context shift, vLLM's
``truncate_prompt_tokens``). Their prompt count is taken *after* the cut, so comparing it with
the window catches nothing (Ollama #17427 reports num_ctx/2 + 2). What does catch it is our own
count of what was sent (calibrated by the server's tokenizer where it has one): a server that
counted clearly fewer tokens than that did not read all of it.

Only a count of the whole prompt is compared: Ollama's ``prompt_eval_count`` (its runner counts
every input of the sequence, those it reused from its cache included; a fully cached prompt may
leave it out: then nothing is compared), OpenAI's ``usage.prompt_tokens``, llama-server's
``timings.cache_n + timings.prompt_n``. A count of the evaluated tokens alone (``prompt_n``
without ``cache_n``) says nothing about a cut: a prompt cache hit makes it small.
"""

from __future__ import annotations

from contemplation.models import ChatRequest, Usage
from contemplation.prompt import budget

# The server's count must be below this share of ours, and below it by MIN_GAP tokens, before
# the prompt is called cut. Our count is an estimate: characters times a ratio learnt from the
# server's earlier counts (or its tokenizer), plus PER_MESSAGE tokens a message. The ratio of a
# text moves with what it holds (prose, code, a list of numbers: ~±20 % between turns of one
# dialogue), and the chat template's tokens a message are a guess; a cut, by contrast, takes
# a large share (Ollama keeps num_ctx/2 + 2 of a prompt over num_ctx, llama-server's context
# shift discards half of what is past n_keep). A share of 0.75 leaves the estimate's error
# room and still catches every cut of a quarter or more; MIN_GAP keeps a short prompt's few
# template tokens from counting as a cut.
SHARE = 0.75
MIN_GAP = 64


def whole_count(usage: Usage) -> int | None:
    """The server's count of the whole prompt it read, or None when it gave none (a count of
    only the tokens it evaluated again is not one: a cache hit makes it small)."""
    if usage.cached_tokens is not None and usage.computed_tokens is not None:
        return usage.cached_tokens + usage.computed_tokens
    count = usage.prompt_eval_count
    if not count:
        return None
    if usage.computed_tokens is not None and count == usage.computed_tokens:
        return None  # only the evaluated tokens (llama-server's prompt_n without cache_n)
    return count


def ratio(planned: float, own: float | None) -> float:
    """The ratio our count of a request is made with: the lower of the one it was planned
    with (the model's, learnt from every conversation, or its tokenizer's count of this very
    request) and the conversation's own (:meth:`~contemplation.prompt.budget.Calibration.own`;
    before the server has counted one, the default: a quarter of a token a character, about
    what tokenizers give English prose and fewer than most other text gets). A ratio too high
    would call an honest count a cut; one too low only lets a small cut pass."""
    return min(planned, budget.DEFAULT_RATIO if own is None else own)


def sent_tokens(request: ChatRequest, ratio: float) -> int:
    """Our count of what ``request`` sends: its text (messages, tool calls, tool definitions)
    at the model's calibrated ratio. The chat template's tokens a message are left out: they
    are a guess (:data:`~contemplation.prompt.budget.PER_MESSAGE`), and the server counts them
    on its side, so leaving them out errs toward no alarm."""
    chars = budget.prompt_chars(request.messages) + sum(len(str(t)) for t in request.tools)
    chars += sum(len(str(c)) for m in request.messages for c in m.tool_calls)
    return int(chars * ratio)


def cut(usage: Usage, request: ChatRequest, ratio: float) -> str:
    """The WARNING for a reply whose server counted clearly fewer prompt tokens than we sent
    (:func:`sent_tokens`); "" when the counts agree or the server gave none."""
    sent = sent_tokens(request, ratio)
    counted = whole_count(usage)
    if counted is None or counted >= sent * SHARE or sent - counted < MIN_GAP:
        return ""
    asked = f" of {usage.context_window}" if usage.context_window else ""
    return (
        f"the server counted {counted} prompt tokens of the ~{sent} sent: it cut the prompt "
        "without a word and this reply was built on what was left (it may lack the oldest "
        f"messages or the instructions); the server's window is smaller than the one{asked} "
        "tokens asked for: set the model's window (num_ctx) to the server's, or ask a server "
        "that refuses instead of cutting"
    )
