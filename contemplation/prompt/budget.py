"""Pure: does a chat request fit the model's context window, and what to leave out if not.

Servers truncate an over-long prompt silently (Ollama keeps the end and drops the start,
system prompt included). We would rather decide ourselves, and say so in the log. A turn asks
:func:`plan`: first old tool outputs become one-line stubs, then the oldest turns are
summarised by the same model (the summary is kept in the log as NOTE lines and reused by
later turns), and only when that call fails are they left out (:func:`fit` is that last step
on its own).

Token counts are estimates (characters times a per-model ratio, plus a few tokens per message);
:class:`Calibration` learns the ratio from the ``prompt_eval_count`` the server reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from contemplation.models import Block, ChatMessage, ChatRequest, MarkerKind, Usage
from contemplation.prompt import prompts, truncation
from contemplation.protocol.logformat import (
    NEED_PREFIX,
    RESPONSE_PREFIX,
    TOOL_OUTPUT_BEGIN,
    TOOL_OUTPUT_END,
)

DEFAULT_RATIO = 0.25  # tokens per character: about 4 characters a token for English
PER_MESSAGE = 4  # role markers and separators in chat templates
MIN_RATIO, MAX_RATIO = 0.1, 1.2
MIN_KEPT = 1024  # tokens: the smallest window a server's cut makes us take (Calibration.cut)
REFUSED_MARGIN = 1.05  # a refused prompt's ratio is raised this much above the server's count
MAX_REFUSED_RATIO = 4.0  # tokens a character, at most, whatever a server counts
SUMMARY_PREFIX = "Summary of the earlier part of this conversation (left out to fit the context):"


def json_chars(obj: object) -> int:
    """Characters of a tool definition or call as it goes over the wire (JSON, not repr)."""
    return len(json.dumps(obj, default=str))


def message_tokens(m: ChatMessage, ratio: float = DEFAULT_RATIO) -> int:
    chars = len(m.content) + sum(json_chars(c) for c in m.tool_calls)
    return int(chars * ratio + 0.999) + PER_MESSAGE


def estimate(
    messages: Sequence[ChatMessage],
    ratio: float = DEFAULT_RATIO,
    tools: Sequence[Mapping[str, object]] = (),
) -> int:
    """Estimated prompt tokens of ``messages`` (and of the tool definitions offered)."""
    tool_chars = sum(json_chars(t) for t in tools)
    return sum(message_tokens(m, ratio) for m in messages) + int(tool_chars * ratio)


def estimate_request(request: ChatRequest, ratio: float = DEFAULT_RATIO) -> int:
    return estimate(request.messages, ratio, request.tools)


def context_warning(usage: Usage, estimate: int) -> str:
    """A WARNING for a reply whose prompt (``usage``, or our ``estimate`` of it) filled the
    window it was sent with: the server may have cut the history; "" when it fitted."""
    window = usage.context_window
    if not window:
        return ""
    used = usage.prompt_eval_count or 0
    if used >= 0.98 * window or estimate > window:
        return (
            f"the prompt (~{max(used, estimate)} tokens) filled the context window ({window}); "
            "the server may have dropped the oldest messages — raise num_ctx or start a new "
            "conversation"
        )
    return ""


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
    asked: dict[str, float] = field(default_factory=dict)  # model -> when a tokenizer was asked
    # per conversation, the server's last honest count of its request (the cut check's)
    counts: truncation.Counts = field(default_factory=truncation.Counts)
    # model -> the tokens a server that cut its prompt kept of it (only ever lowered)
    kept: dict[str, int] = field(default_factory=dict)

    def ratio(self, model: str) -> float:
        return self.ratios.get(model, DEFAULT_RATIO)

    def cut(self, model: str, counted: int) -> int:
        """A server cut a prompt of ``model`` and counted the ``counted`` tokens it kept: the
        model's window is taken as that from now on (never raised), so that the next request
        is fitted to what the server reads instead of being cut again. Never below
        :data:`MIN_KEPT`: a count that small is more likely a server counting only what it
        did not have cached (older Ollama did) than a window, and a window that small would
        summarise every turn; a cut below it is still told on each reply."""
        kept = max(MIN_KEPT, counted)
        self.kept[model] = min(kept, self.kept.get(model, kept))
        return self.kept[model]

    def measured(self, model: str) -> bool:
        """A server has counted ``model``'s prompts (its reply, a refusal or its tokenizer)."""
        return model in self.ratios

    def counted(self, model: str, chars: int, tokens: int) -> float:
        """The server's tokenizer counted ``tokens`` for ``chars`` characters of a request:
        the ratio is the server's, at once (the chat template's few tokens a message are
        :data:`PER_MESSAGE`)."""
        if chars <= 0 or tokens <= 0:
            return self.ratio(model)
        new = min(max(tokens / chars, MIN_RATIO), MAX_REFUSED_RATIO)
        self.ratios[model] = new
        return new

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

    def refused(self, model: str, request: ChatRequest, counted: int) -> float:
        """The server refused ``request`` for its window, counting ``counted`` prompt tokens
        (its own tokenizer): the ratio is raised at once, with a margin, so that the request
        made again is planned with the server's count (never lowered here)."""
        chars = prompt_chars(request.messages) + sum(json_chars(t) for t in request.tools)
        chars += sum(json_chars(c) for m in request.messages for c in m.tool_calls)
        if chars <= 0:
            return self.ratio(model)
        sample = (counted - PER_MESSAGE * len(request.messages)) / chars * REFUSED_MARGIN
        new = max(self.ratio(model), min(sample, MAX_REFUSED_RATIO))
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
) -> tuple[list[ChatMessage], int, str]:
    """``messages`` made to fit ``context_window - reserve`` tokens.

    Returns the messages to send, how many were dropped, and a one-line note (empty when
    nothing was dropped). System messages and the newest turn are always kept; the oldest
    whole turns go first (what :func:`plan` falls back to when no summary can be made)."""
    budget = max(0, context_window - reserve)
    msgs = list(messages)
    if estimate(msgs, ratio) <= budget:
        return msgs, 0, ""
    system = [i for i, m in enumerate(msgs) if m.role == "system"]
    turns = _turns(msgs)
    head_cost = sum(message_tokens(msgs[i], ratio) for i in system)
    costs = [sum(message_tokens(msgs[i], ratio) for i in t) for t in turns]
    kept_from = len(turns) - 1 if turns else 0  # the newest turn is always kept
    total = head_cost + sum(costs[kept_from:])
    while kept_from > 0 and total + costs[kept_from - 1] <= budget:
        kept_from -= 1
        total += costs[kept_from]
    dropped_idx = {i for t in turns[:kept_from] for i in t}
    dropped = len(dropped_idx)
    kept = [m for i, m in enumerate(msgs) if i not in dropped_idx]
    note = ""
    if dropped:
        note = (
            f"{dropped} earlier message(s) were left out to fit the model's context window "
            f"({context_window} tokens)"
        )
    if total > budget:
        kept, cut = cut_to_fit(kept, budget, context_window, ratio)
        note = f"{note}; {cut}" if note and cut else note or cut
        total = estimate(kept, ratio)
    if total > budget:
        over = f"the prompt (~{total} tokens) is still larger than the window less the reserve"
        note = f"{note}; {over}" if note else over
    return kept, dropped, note


def cut_to_fit(
    messages: Sequence[ChatMessage], budget: int, window: int, ratio: float = DEFAULT_RATIO
) -> tuple[list[ChatMessage], str]:
    """What is still larger than ``budget`` once the history was fitted (a model reply of
    20,000 NEED lines, a tool output no stub covers): the largest of the model's replies and
    the answers to its needs are cut in the middle, each with a line saying how much was left
    out, until the prompt fits; the newest message and the system prompt never (the note
    then says the prompt is still too large). Returns the messages and a note ("" when
    nothing was cut): a cut the model and the log are told of, never a silent one by the
    server."""
    msgs = list(messages)
    total = estimate(msgs, ratio)
    newest_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    others = [  # never the system prompt, the newest message, nor the agent's newest words
        i for i, m in enumerate(msgs[:-1]) if m.role != "system" and i != newest_user
    ]
    cut = 0
    for i in sorted(others, key=lambda i: -len(msgs[i].content)):
        if total <= budget:
            break
        m = msgs[i]
        tokens = message_tokens(m, ratio)
        keep = int(max(64, tokens - (total - budget) - 64) / ratio)
        if keep >= len(m.content):
            continue
        head, tail = m.content[: keep // 2], m.content[len(m.content) - keep // 2 :]
        left = len(m.content) - len(head) - len(tail)
        marker = (
            f"\n[… {left} characters of this message left out to fit the model's context "
            f"window ({window} tokens) …]\n"
        )
        msgs[i] = replace(m, content=head + marker + tail)
        total += message_tokens(msgs[i], ratio) - tokens
        cut += 1
    if not cut:
        return msgs, ""
    return msgs, (
        f"{cut} message(s) larger than the model's context window ({window} tokens) were cut "
        "in the middle, each saying how much was left out"
    )


# --------------------------------------------------------------------------- history that fits
#
# When the history is larger than the window, three steps, each only if the one before was not
# enough (see docs/reference/format.md, "When the history outgrows the window"):
#
# 1. old tool outputs (RESPONSE TO NEED blocks the model has already answered) become a
#    one-line stub that says how to get them back: the same NEED line;
# 2. the oldest turns are summarised by the same model; the summary goes into the log as
#    NOTE lines (:func:`summary_notes`), and later turns read it back (:func:`read_summary`)
#    instead of summarising again; the history is filled newest first behind it;
# 3. when the summary call fails, the oldest turns are left out, as :func:`fit` does.
#
# :func:`plan` decides (pure); the turn makes the one summary call when the plan asks for one
# and finishes with :meth:`Plan.with_summary` or :meth:`Plan.without_summary`.

DEFAULT_RESERVE = 1024  # tokens kept free for the reply
LOW_WATER = 0.5  # a compaction keeps the history under this share of the window less the reserve
SUMMARY_MAX_WORDS = 150  # asked of the model
SUMMARY_MAX_TOKENS = 400  # num_predict of the summary call
SUMMARY_MAX_CHARS = 1200  # what is kept of its answer (written to the log, sent every turn)
SUMMARY_SHARE = 10  # a summary gets at most a tenth of the window
SUMMARY_MIN_TOKENS = 48
ASK_TOKENS = 48  # the summary call's instruction, a bound of its tokens (summarise.SUMMARY_ASK)
MIN_ENTRY_CHARS = 300  # a message cut shorter than this says too little to summarise
NOTE_CHARS = 480  # text per NOTE line (logformat.one_line cuts a marker's text at 500)
SUMMARY_HEAD = "summary of the log before the last {keep} block(s)"
SUMMARY_MORE = "summary, continued: "
REUSED_TAIL = "the summary above stands in for them"  # a reused summary's NOTE, said once
_SUMMARY_RE = re.compile(r"^summary of the log before the last (\d+) block\(s\)[^:]*: (.*)$", re.S)
_SUMMARY_ASK = (
    "Summarise this earlier part of a conversation in at most {words} words. Keep facts, "
    "decisions, open questions and the answers to requests for context; leave out "
    "pleasantries. Write only the summary."
)


def summary_tokens(window: int) -> int:
    """The summary's bound in tokens for ``window`` (its call's ``num_predict``): a tenth of
    the window, between :data:`SUMMARY_MIN_TOKENS` and :data:`SUMMARY_MAX_TOKENS`. A summary
    of 374 tokens in a 1,024-token window left room for three turns before the next one."""
    if window <= 0:
        return SUMMARY_MAX_TOKENS
    return max(SUMMARY_MIN_TOKENS, min(SUMMARY_MAX_TOKENS, window // SUMMARY_SHARE))


def summary_words(window: int) -> int:
    """The words the summary is asked for: 150 at the largest bound, in proportion below."""
    return max(20, SUMMARY_MAX_WORDS * summary_tokens(window) // SUMMARY_MAX_TOKENS)


def summary_chars(window: int) -> int:
    """What is kept of a summary's text for ``window`` (written to the log, sent every turn)."""
    return SUMMARY_MAX_CHARS * summary_tokens(window) // SUMMARY_MAX_TOKENS


def compact_at(window: int, reserve: int, tools_cost: int = 0) -> int:
    """The prompt size past which a turn compacts: below the window less the reply's reserve,
    and low enough that the next summary call still fits the window as the conversation's own
    prompt (the last request and its reply, the instruction appended, the bounded summary).
    Compaction that waits for the window's edge finds no room for that call, and a summary
    sent as a transcript in a prompt of its own replaces the slot's cache, system prompt
    included."""
    edge = window - reserve - tools_cost
    floor = window - tools_cost - summary_tokens(window) - ASK_TOKENS - reserve
    return max(0, min(edge, floor))


def reply_reserve(window: int, options: Mapping[str, object]) -> int:
    """Tokens kept free for the reply: ``num_predict`` when it is set, else 1,024; never more
    than a quarter of the window (a small window still gets most of it for the history)."""
    n = options.get("num_predict")
    want = n if isinstance(n, int) and n > 0 else DEFAULT_RESERVE
    return max(0, min(want, window // 4))


def stub_tool_output(m: ChatMessage) -> ChatMessage | None:
    """``m`` with its tool output (between BEGIN and END TOOL OUTPUT) replaced by one line that
    says how to ask for it again; None when ``m`` carries no tool output."""
    if m.role not in {"user", "tool"} or not m.content.startswith(RESPONSE_PREFIX):
        return None
    lines = m.content.split("\n")
    begin = next((i for i, ln in enumerate(lines) if ln.startswith(TOOL_OUTPUT_BEGIN)), None)
    if begin is None:
        return None
    end = next((i for i in range(begin + 1, len(lines)) if lines[i] == TOOL_OUTPUT_END), None)
    if end is None:
        return None
    if end + 1 < len(lines) and lines[end + 1].startswith("(more exists:"):
        end += 1
    need = lines[0][len(RESPONSE_PREFIX) :].strip()
    chars = sum(len(ln) + 1 for ln in lines[begin + 1 : end])
    stub = (
        f"(tool output left out to fit the context window, {chars:,} characters; "
        f"to see it again, ask again with the same line: {NEED_PREFIX} {need})"
    )
    return replace(m, content="\n".join([*lines[:begin], stub, *lines[end + 1 :]]))


def evict(
    messages: Sequence[ChatMessage], budget: int, ratio: float = DEFAULT_RATIO, *, extra: int = 0
) -> tuple[list[ChatMessage], int]:
    """Stub the oldest tool outputs until ``messages`` (plus ``extra`` tokens) fit ``budget``.

    The tool outputs after the last assistant message are the ones the model is about to
    read: they are never stubbed. Returns the messages and how many outputs were stubbed.
    """
    msgs = list(messages)
    total = estimate(msgs, ratio) + extra
    last_reply = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    stubbed = 0
    for i in range(last_reply):
        if total <= budget:
            break
        short = stub_tool_output(msgs[i])
        if short is None:
            continue
        total -= message_tokens(msgs[i], ratio) - message_tokens(short, ratio)
        msgs[i] = short
        stubbed += 1
    return msgs, stubbed


@dataclass(frozen=True, slots=True)
class Saved:
    """A summary read back from the log: its text and the first block it does not cover
    (``at``: the block that holds it)."""

    text: str
    covers: int
    at: int = field(default=-1, compare=False)


def _flat(text: str) -> str:
    return " ".join(text.split()).replace("===", "= = =")


def cap_summary(text: str, limit: int = SUMMARY_MAX_CHARS) -> str:
    """The model's summary as one paragraph of at most ``limit`` characters."""
    flat = _flat(text)
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut) + "…"


def summary_notes(text: str, keep: int, why: str = "") -> list[str]:
    """The NOTE lines that hold a summary of the log before the last ``keep`` blocks (the
    block that gets the NOTEs counts as one of them). ``why`` goes into the first line."""
    head = SUMMARY_HEAD.format(keep=keep) + (f" ({why.replace(':', ',')})" if why else "") + ": "
    words = cap_summary(text).split(" ")
    lines: list[str] = []
    current = head
    for word in words:
        if len(current) + len(word) + 1 > NOTE_CHARS and current not in {head, SUMMARY_MORE}:
            lines.append(current.rstrip(" "))
            current = SUMMARY_MORE
        rest = word
        while len(current) + len(rest) > NOTE_CHARS:  # one very long word: cut it
            room = NOTE_CHARS - len(current)
            lines.append(current + rest[:room])
            current, rest = SUMMARY_MORE, rest[room:]
        current += rest + " "
    lines.append(current.rstrip(" "))
    return lines


def read_summary(blocks: Sequence[Block]) -> Saved | None:
    """The newest summary in the log (:func:`summary_notes`), or None."""
    for idx in range(len(blocks) - 1, -1, -1):
        markers = blocks[idx].markers
        for j in range(len(markers) - 1, -1, -1):
            kind, text = markers[j]
            m = _SUMMARY_RE.match(text) if kind is MarkerKind.NOTE else None
            if m is None:
                continue
            parts = [m.group(2)]
            for kind2, more in markers[j + 1 :]:
                if kind2 is not MarkerKind.NOTE or not more.startswith(SUMMARY_MORE):
                    break
                parts.append(more[len(SUMMARY_MORE) :])
            keep = max(1, int(m.group(1)))  # the block that holds it is never in it
            return Saved(" ".join(parts).strip(), max(0, idx + 1 - keep), at=idx)
    return None


def _said(blocks: Sequence[Block], tail: str) -> bool:
    """A NOTE in ``blocks`` ends with ``tail``."""
    return any(k is MarkerKind.NOTE and t.endswith(tail) for b in blocks for k, t in b.markers)


def with_summary(messages: Sequence[ChatMessage], summary: str) -> list[ChatMessage]:
    """``messages`` with the summary appended to the first system message (a second system
    message is not something every chat template accepts)."""
    msgs = list(messages)
    text = f"{SUMMARY_PREFIX}\n{summary.strip()}"
    for i, m in enumerate(msgs):
        if m.role == "system":
            msgs[i] = replace(m, content=f"{m.content}\n\n{text}")
            return msgs
    return [ChatMessage("system", text), *msgs]


def _summary_cost(ratio: float, chars: int = SUMMARY_MAX_CHARS) -> int:
    return int((len(SUMMARY_PREFIX) + 3 + chars) * ratio + 0.999)


def _window_note(window: int) -> str:
    return f"to fit the model's context window ({window} tokens)"


def _evicted_note(n: int, window: int) -> str:
    return (
        f"{n} old tool output(s) were replaced by a one-line stub {_window_note(window)}; "
        "the model can ask for them again"
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """What to send. With ``summarise`` empty, ``request`` and ``notes`` are final; otherwise
    a summary of ``summarise`` (after ``previous``) is due: finish with :meth:`with_summary`
    or, when the summary call failed, :meth:`without_summary`."""

    request: ChatRequest
    notes: tuple[str, ...] = ()
    summarise: tuple[ChatMessage, ...] = ()
    previous: str | None = None  # the summary in the log that the new one extends
    keep: int = 0  # blocks the new summary leaves out, counted back from the newest
    left_out: int = 0  # messages the request leaves out (in the summary instead)
    unseen: int = 0  # of those, the oldest ones not in ``summarise`` (never read: too far)
    window: int = 0
    budget: int = 0
    ratio: float = DEFAULT_RATIO
    system: tuple[ChatMessage, ...] = ()
    kept: tuple[ChatMessage, ...] = ()  # the newest messages, as in the history

    @property
    def summarised(self) -> int:
        """How many messages the summary stands in for (after the one it extends)."""
        return len(self.summarise) + self.unseen

    def with_summary(self, text: str) -> tuple[ChatRequest, list[str]]:
        summary = cap_summary(text, summary_chars(self.window))
        why = (
            f"{self.left_out} message(s) summarised {_window_note(self.window)}"
            if self.previous is None
            else f"it takes in the one before and {self.summarised} more message(s), "
            f"{_window_note(self.window)}"
        )
        request, notes = self._finish(summary, "")
        return request, [*notes, *summary_notes(summary, self.keep, why)]

    def without_summary(self, why: str) -> tuple[ChatRequest, list[str]]:
        previous = cap_summary(self.previous) if self.previous else None
        stands = "; the older summary above stands in for what came before" if previous else ""
        note = (
            f"summarising {self.summarised} earlier message(s) failed ({why}); "
            f"{self.left_out} message(s) were left out {_window_note(self.window)}{stands}"
        )
        return self._finish(previous, note)

    def _finish(self, summary: str | None, note: str) -> tuple[ChatRequest, list[str]]:
        head = with_summary(self.system, summary) if summary else list(self.system)
        kept, stubbed = evict(self.kept, self.budget, self.ratio, extra=estimate(head, self.ratio))
        notes = [_evicted_note(stubbed, self.window)] if stubbed else []
        if note:
            notes.append(note)
        messages, cut = cut_to_fit([*head, *kept], self.budget, self.window, self.ratio)
        if cut:
            notes.append(cut)
        total = estimate(messages, self.ratio)
        if total > self.budget:
            notes.append(
                f"the prompt (~{total} tokens) is still larger than the window less the reserve"
            )
        return replace(self.request, messages=tuple(messages)), notes


def plan(
    request: ChatRequest,
    window: int,
    *,
    blocks: Sequence[Block],
    reserve: int = DEFAULT_RESERVE,
    ratio: float = DEFAULT_RATIO,
    first: int = 0,
) -> Plan:
    """How ``request`` (built from ``blocks[first:]``) is made to fit ``window`` tokens less
    ``reserve`` for the reply (the tool definitions count too). The plan keeps ``window``
    and ``ratio``: the reply's usage is measured against them. ``blocks[:first]`` may be
    bare (no text): they lie beyond what the window and the summary call can reach (see
    :mod:`contemplation.prompt.reach`); only their markers and count are used."""
    fitted = _plan(request, window, blocks=blocks, reserve=reserve, ratio=ratio, first=first)
    return replace(fitted, window=window, ratio=ratio)


def _plan(
    request: ChatRequest,
    window: int,
    *,
    blocks: Sequence[Block],
    reserve: int,
    ratio: float,
    first: int = 0,
) -> Plan:
    tools_cost = estimate((), ratio, request.tools)
    budget = max(0, window - reserve - tools_cost)
    at = compact_at(window, reserve, tools_cost)  # below budget: room for the summary call
    msgs = list(request.messages)
    if estimate(msgs, ratio) <= at:
        return Plan(request)
    # 1. old tool outputs become stubs
    evicted, stubbed = evict(msgs, at, ratio)
    notes = (_evicted_note(stubbed, window),) if stubbed else ()
    if estimate(evicted, ratio) <= at:
        return Plan(replace(request, messages=tuple(evicted)), notes)
    # 2. a summary: which block does each message come from? (A request whose history is not
    # the log's cannot say what a summary covers: its oldest turns are left out, as before.)
    system = tuple(m for m in msgs if m.role == "system")
    rest = [m for m in msgs if m.role != "system"]
    indexed = prompts.history_blocks(tuple(blocks[first:]))
    if [m for _, m in indexed] != rest:
        kept, _, note = fit(evicted, window, reserve=reserve + tools_cost, ratio=ratio)
        return Plan(replace(request, messages=tuple(kept)), (*notes, note) if note else notes)
    block_of = [i + first for i, _ in indexed]
    saved = read_summary(blocks)
    before = prompts.message_count(blocks[:first]) if first else 0  # messages not read
    start, unseen = 0, before
    if saved is not None:
        start = next((i for i, b in enumerate(block_of) if b >= saved.covers), len(rest))
        if start >= len(rest):  # it covers every message (written by hand?): not usable
            saved, start = None, 0
        elif saved.covers < first:
            unseen = before - prompts.message_count(blocks[: saved.covers])
        else:
            unseen = 0
    short = [m for m in evicted if m.role != "system"]
    turns = [[i + start for i in t] for t in _turns(short[start:])]
    costs = [sum(message_tokens(short[i], ratio) for i in t) for t in turns]
    head = estimate(system, ratio)
    base = Plan(request, window=window, budget=budget, ratio=ratio, system=system)
    old = cap_summary(saved.text) if saved is not None else None
    if old is not None and head + _summary_cost(ratio, len(old)) + sum(costs) <= at:
        # the summary in the log still covers enough: no call
        req, out = replace(base, kept=tuple(rest[start:]))._finish(old, "")
        if saved is not None and _said(blocks[saved.at + 1 :], REUSED_TAIL):
            return Plan(req, tuple(out))  # said once, at its first reuse: not every turn
        reused = (
            f"{before + start} earlier message(s) were left out {_window_note(window)}; "
            f"{REUSED_TAIL}"
        )
        return Plan(req, (*out, reused))
    # fitted at once to the low-water mark, not to the brim: the turns after it grow into the
    # room left, and the prefix the server caches stays the same until the next compaction
    room = int(at * LOW_WATER) - head - _summary_cost(ratio, summary_chars(window))
    kept_from = len(turns) - 1  # the newest turn is always kept
    total = costs[kept_from] if turns else 0
    while kept_from > 0 and total + costs[kept_from - 1] <= room:
        kept_from -= 1
        total += costs[kept_from]
    if kept_from <= 0:  # nothing to summarise: only the newest turn is left after the summary
        req, out = replace(base, kept=tuple(rest[start:]))._finish(old, "")
        return Plan(req, tuple(out))
    cut = turns[kept_from][0]
    return replace(  # (the stubs of step 1 are not the final ones: _finish counts again)
        base,
        summarise=tuple(rest[start:cut]),
        previous=saved.text if saved is not None else None,
        keep=len(blocks) - block_of[cut],
        left_out=before + cut,
        unseen=unseen,
        kept=tuple(rest[cut:]),
    )


def _share(entries: list[str], chars: int) -> list[str]:
    """Each entry cut to a fair share of ``chars`` (its end left out); short ones stay whole."""
    if sum(len(e) for e in entries) <= chars:
        return entries
    order = sorted(range(len(entries)), key=lambda i: len(entries[i]))
    left, cap = chars, len(entries[order[-1]])
    for k, i in enumerate(order):
        share = left // (len(entries) - k)
        if len(entries[i]) > share:
            cap = share
            break
        left -= len(entries[i])
    return [e if len(e) <= cap else e[: max(0, cap - 1)] + "…" for e in entries]


def summary_request_for(
    plan_: Plan, *, think: bool | None = None, max_words: int = SUMMARY_MAX_WORDS
) -> ChatRequest:
    """The summary call as a transcript in a prompt of its own, made to fit the same window
    (:func:`transcript`). Not what a turn sends: a prompt of its own replaces the server's
    cache of the conversation; :mod:`contemplation.prompt.summarise`
    sends the conversation's own prompt with the instruction appended."""
    ask = _SUMMARY_ASK.format(words=max_words)
    bound = summary_tokens(plan_.window)
    ratio = max(plan_.ratio, MIN_RATIO)
    room = plan_.window - bound - PER_MESSAGE - int((len(ask) + 8) * ratio) - 1
    options = {k: v for k, v in plan_.request.options.items() if k in {"num_ctx"}}
    options["num_predict"] = bound
    return ChatRequest(
        model=plan_.request.model,
        messages=(ChatMessage("user", f"{ask}\n\n{transcript(plan_, room)}"),),
        options=options,
        think=think,
    )


def transcript(plan_: Plan, room: int) -> str:
    """What ``plan_`` leaves out (after the summary it extends) as a transcript of about
    ``room`` tokens at most: tool outputs become stubs, then every message gets a fair share
    of the room (the end of a long one is cut), and only when even that is too little are
    the oldest left out, said in a line."""
    parts: list[str] = []
    if plan_.previous:
        parts.append(f"SUMMARY OF WHAT CAME BEFORE: {cap_summary(plan_.previous)}")
    ratio = max(plan_.ratio, MIN_RATIO)
    room -= sum(int((len(p) + 2) * ratio) + 1 for p in parts)
    entries = [f"{m.role.upper()}: {m.content}" for m in plan_.summarise]
    if sum(len(e) + 2 for e in entries) * ratio > room:
        entries = [
            f"{m.role.upper()}: {(stub_tool_output(m) or m).content}" for m in plan_.summarise
        ]
    skipped = plan_.unseen  # (too many to show: see reach.py)
    while entries and len(entries) * MIN_ENTRY_CHARS * ratio > room:
        entries.pop(0)
        skipped += 1
    if skipped:
        parts.append(f"({skipped} earlier message(s) did not fit here and are not shown)")
        room -= int((len(parts[-1]) + 2) * ratio) + 1
    chars = int(max(0, room) / ratio) - 4 * len(entries)
    return "\n\n".join([*parts, *_share(entries, max(0, chars))])
