"""Pure: was the reply built on a prompt the server cut? (servers that still truncate)

An older Ollama ignores ``"truncate": false`` and cuts a prompt over ``num_ctx`` without a word,
and some OpenAI-compatible servers cut too (llama-server's context shift, vLLM's
``truncate_prompt_tokens``). Their prompt count is taken *after* the cut, so comparing it with
the window catches nothing (Ollama #17427 reports num_ctx/2 + 2). What does catch it is our own
count of what was sent: a server that counted clearly fewer tokens than that did not read all
of it.

Our count is made so that an honest server never counts clearly fewer (a false alarm is worse
than a small cut let pass): where the request extends the conversation's previous one (the
usual turn: the same messages, then the reply and the new message), the server's own count of
that previous request, plus the new text at a low ratio; otherwise the whole text at a low
ratio. The low ratio is the calibrated one (the model's, learnt from the server's counts or its
tokenizer's count of this very request) but never above a quarter of a token a character,
about what tokenizers give English prose and fewer than most other text gets: the model's
ratio mixes every conversation's (a table of digits counts a token a digit), and a conversation
of digits compacted to a summary in prose counts fewer a character than before.

Only a count of the whole prompt is compared: Ollama's ``prompt_eval_count`` (its runner counts
every input of the sequence, those it reused from its cache included; a fully cached prompt may
leave it out: then nothing is compared), OpenAI's ``usage.prompt_tokens``, llama-server's
``timings.cache_n + timings.prompt_n``. A count of the evaluated tokens alone (``prompt_n``
without ``cache_n``) says nothing about a cut: a prompt cache hit makes it small. A count
suspected of a cut is never kept nor learnt from: it is the count of what was left.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contemplation.models import ChatMessage, ChatRequest, Usage

# The server's count must be below this share of ours, and below it by MIN_GAP tokens, before
# the prompt is called cut. Our count errs low (see above), but the new text's ratio and the
# chat template's tokens are still estimates; a cut, by contrast, takes a large share (Ollama
# keeps num_ctx/2 + 2 of a prompt over num_ctx, llama-server's context shift discards half of
# what is past n_keep). A share of 0.75 leaves the estimate room and still catches a cut of a
# quarter or more of what we count; MIN_GAP keeps a short prompt's few tokens out of it.
SHARE = 0.75
MIN_GAP = 64
LOW_RATIO = 0.25  # tokens a character at most for our count (budget.DEFAULT_RATIO)
KEPT = 1024  # conversations whose last count is kept (the least recent go first)


@dataclass(frozen=True, slots=True)
class Counted:
    """The server's honest count of one request of a conversation."""

    messages: int  # how many messages it had
    digest: bytes  # of its tool definitions and those messages (see :func:`_digest`)
    chars: int
    tokens: int
    tools: bytes = b""  # the digest of its tool definitions alone (ledger.miss)


class Counts:
    """Per conversation, the server's last honest count of its request (bounded)."""

    def __init__(self) -> None:
        self._last: dict[str, Counted] = {}

    def __len__(self) -> int:
        return len(self._last)

    def last(self, conversation: str) -> Counted | None:
        return self._last.get(conversation)

    def keep(self, conversation: str, request: ChatRequest, tokens: int) -> None:
        self._last.pop(conversation, None)  # the newest last: the oldest go first
        self._last[conversation] = Counted(
            len(request.messages),
            _digest(request.messages, request.tools),
            _chars(request),
            tokens,
            _digest((), request.tools),
        )
        while len(self._last) > KEPT:
            del self._last[next(iter(self._last))]


def _chars(request: ChatRequest) -> int:
    """The characters of the messages and their tool calls. Not the tool definitions: how a
    chat template renders them (JSON, a list of signatures, not at all) is the server's."""
    chars = sum(len(m.content) for m in request.messages)
    calls = (c for m in request.messages for c in m.tool_calls)
    return chars + sum(len(json.dumps(c, default=str)) for c in calls)  # as sent: JSON


def _digest(messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]]) -> bytes:
    """Of the tool definitions and ``messages``, in order."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(list(tools), sort_keys=True, default=str).encode() + b"\1")
    for m in messages:
        calls = json.dumps(list(m.tool_calls), sort_keys=True, default=str)
        h.update(f"{m.role}\0{len(m.content)}\0{m.content}\0{calls}\1".encode())
    return h.digest()


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


def extends(request: ChatRequest, last: Counted) -> bool:
    """``request`` begins with the messages and tools of ``last`` (the conversation's previous
    request): what the server held of it is this one's prefix."""
    return (
        len(request.messages) >= last.messages
        and _digest(request.messages[: last.messages], request.tools) == last.digest
    )


def same_tools(request: ChatRequest, last: Counted) -> bool:
    return _digest((), request.tools) == last.tools


def sent_tokens(request: ChatRequest, ratio: float, last: Counted | None = None) -> int:
    """Our count of what ``request`` sends (see the module's words): the server's count of
    ``last`` (the conversation's previous request) when ``request`` extends it, plus the rest
    of its text (messages and tool calls) at ``ratio``, never above LOW_RATIO.
    The chat template's tokens a message are left out of the new text: the server counts
    them on its side, so leaving them out errs toward no alarm."""
    low = min(ratio, LOW_RATIO)
    chars = _chars(request)
    if (
        last is not None
        and len(request.messages) >= last.messages
        and chars >= last.chars
        and _digest(request.messages[: last.messages], request.tools) == last.digest
    ):
        return last.tokens + int((chars - last.chars) * low)
    return int(chars * low)


def check(
    counts: Counts, conversation: str, usage: Usage, request: ChatRequest, ratio: float
) -> str:
    """The WARNING for a reply whose server counted clearly fewer prompt tokens than we sent
    (:func:`sent_tokens`); "" when the counts agree (the count is then kept for the
    conversation's next request) or the server gave none."""
    counted = whole_count(usage)
    if counted is None:
        return ""
    sent = sent_tokens(request, ratio, counts.last(conversation))
    if counted >= sent * SHARE or sent - counted < MIN_GAP:
        counts.keep(conversation, request, counted)
        return ""
    asked = f" of {usage.context_window}" if usage.context_window else ""
    return (
        f"the server counted {counted} prompt tokens of the ~{sent} sent: it cut the prompt "
        "without a word and this reply was built on what was left (it may lack the oldest "
        f"messages or the instructions); the server's window is smaller than the one{asked} "
        "tokens asked for: set the model's window (num_ctx) to the server's, or ask a server "
        "that refuses instead of cutting"
    )
