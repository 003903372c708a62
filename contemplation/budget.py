"""Pure: does a chat request fit the model's context window, and what to leave out if not.

Servers truncate an over-long prompt silently (Ollama keeps the end and drops the start,
system prompt included). We would rather decide ourselves, and say so: :func:`fit` keeps the
system message and the newest messages, drops the oldest turns, and returns a note for the log.
Optionally the dropped turns are replaced by a summary the caller made with the same model
(:func:`summary_request`, then ``fit(..., summary=...)``).

Token counts are estimates (characters times a per-model ratio, plus a few tokens per message);
:class:`Calibration` learns the ratio from the ``prompt_eval_count`` the server reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from contemplation.models import ChatMessage, ChatRequest

DEFAULT_RATIO = 0.25  # tokens per character: about 4 characters a token for English
PER_MESSAGE = 4  # role markers and separators in chat templates
MIN_RATIO, MAX_RATIO = 0.1, 1.2
SUMMARY_PREFIX = "Summary of the earlier part of this conversation (left out to fit the context):"


def message_tokens(m: ChatMessage, ratio: float = DEFAULT_RATIO) -> int:
    chars = len(m.content) + sum(len(str(c)) for c in m.tool_calls)
    return int(chars * ratio + 0.999) + PER_MESSAGE


def estimate(
    messages: Sequence[ChatMessage],
    ratio: float = DEFAULT_RATIO,
    tools: Sequence[Mapping[str, object]] = (),
) -> int:
    """Estimated prompt tokens of ``messages`` (and of the tool definitions offered)."""
    tool_chars = sum(len(str(t)) for t in tools)
    return sum(message_tokens(m, ratio) for m in messages) + int(tool_chars * ratio)


def estimate_request(request: ChatRequest, ratio: float = DEFAULT_RATIO) -> int:
    return estimate(request.messages, ratio, request.tools)


def prompt_chars(messages: Sequence[ChatMessage]) -> int:
    return sum(len(m.content) for m in messages)


@dataclass
class Calibration:
    """Tokens-per-character ratio per model, learnt from the server's prompt_eval_count.

    A sample is ignored when it is implausible (a server that reused its prompt cache may
    report only the newly evaluated tokens, which looks like a tiny ratio).
    """

    weight: float = 0.3  # how much one new sample moves the ratio
    ratios: dict[str, float] = field(default_factory=dict)

    def ratio(self, model: str) -> float:
        return self.ratios.get(model, DEFAULT_RATIO)

    def observe(self, model: str, messages: Sequence[ChatMessage], prompt_eval_count: int) -> float:
        chars = prompt_chars(messages)
        overhead = PER_MESSAGE * len(messages)
        if chars < 200 or prompt_eval_count <= overhead:
            return self.ratio(model)
        sample = (prompt_eval_count - overhead) / chars
        if not MIN_RATIO <= sample <= MAX_RATIO:
            return self.ratio(model)
        old = self.ratios.get(model)
        new = sample if old is None else old + self.weight * (sample - old)
        self.ratios[model] = new
        return new


def _turns(messages: Sequence[ChatMessage]) -> list[list[int]]:
    """Indexes of the non-system messages grouped into turns (a user message and what follows)."""
    turns: list[list[int]] = []
    for i, m in enumerate(messages):
        if m.role == "system":
            continue
        if m.role == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return turns


def fit(
    messages: Sequence[ChatMessage],
    context_window: int,
    *,
    reserve: int = 1024,
    ratio: float = DEFAULT_RATIO,
    summary: str | None = None,
) -> tuple[list[ChatMessage], int, str]:
    """``messages`` made to fit ``context_window - reserve`` tokens.

    Returns the messages to send, how many were dropped, and a one-line note (empty when
    nothing was dropped). System messages and the newest turn are always kept; the oldest
    whole turns go first. With ``summary``, it stands in for what was dropped.
    """
    budget = max(0, context_window - reserve)
    msgs = list(messages)
    if estimate(msgs, ratio) <= budget:
        return msgs, 0, ""
    system = [i for i, m in enumerate(msgs) if m.role == "system"]
    turns = _turns(msgs)
    head_cost = sum(message_tokens(msgs[i], ratio) for i in system)
    summary_msg = _summary_message(summary) if summary else None
    if summary_msg is not None:
        head_cost += message_tokens(summary_msg, ratio)
    costs = [sum(message_tokens(msgs[i], ratio) for i in t) for t in turns]
    kept_from = len(turns) - 1 if turns else 0  # the newest turn is always kept
    total = head_cost + sum(costs[kept_from:])
    while kept_from > 0 and total + costs[kept_from - 1] <= budget:
        kept_from -= 1
        total += costs[kept_from]
    dropped_idx = {i for t in turns[:kept_from] for i in t}
    dropped = len(dropped_idx)
    kept = [m for i, m in enumerate(msgs) if i not in dropped_idx]
    if dropped and summary_msg is not None:
        at = len([i for i in system if i < min(dropped_idx)])
        kept.insert(at, summary_msg)
    note = ""
    if dropped:
        how = "summarised" if summary_msg is not None else "left out"
        note = (
            f"{dropped} earlier message(s) were {how} to fit the model's context window "
            f"({context_window} tokens)"
        )
    if total > budget:
        over = f"the prompt (~{total} tokens) is still larger than the window less the reserve"
        note = f"{note}; {over}" if note else over
    return kept, dropped, note


def dropped_messages(messages: Sequence[ChatMessage], dropped: int) -> list[ChatMessage]:
    """The oldest ``dropped`` non-system messages (what :func:`fit` left out)."""
    return [m for m in messages if m.role != "system"][:dropped]


def _summary_message(summary: str) -> ChatMessage:
    return ChatMessage("system", f"{SUMMARY_PREFIX}\n{summary.strip()}")


def summary_request(
    model: str, dropped: Sequence[ChatMessage], *, max_words: int = 200
) -> ChatRequest:
    """A request that asks the model to summarise the turns :func:`fit` dropped."""
    transcript = "\n\n".join(f"{m.role.upper()}: {m.content}" for m in dropped)
    ask = (
        f"Summarise this earlier part of a conversation in at most {max_words} words. Keep "
        "facts, decisions, open questions and the answers to requests for context; leave out "
        "pleasantries.\n\n" + transcript
    )
    return ChatRequest(model=model, messages=(ChatMessage("user", ask),))


def fit_request(
    request: ChatRequest,
    context_window: int,
    *,
    reserve: int = 1024,
    ratio: float = DEFAULT_RATIO,
    summary: str | None = None,
) -> tuple[ChatRequest, int, str]:
    """:func:`fit` for a whole request (the tool definitions count against the window)."""
    tools_cost = estimate((), ratio, request.tools)
    kept, dropped, note = fit(
        request.messages,
        context_window,
        reserve=reserve + tools_cost,
        ratio=ratio,
        summary=summary,
    )
    return replace(request, messages=tuple(kept)), dropped, note
