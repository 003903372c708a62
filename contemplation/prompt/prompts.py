"""Pure: history + template + the offered NEED forms → the chat request sent to a model."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from contemplation.models import (
    Block,
    BlockKind,
    ChatMessage,
    ChatRequest,
    MarkerKind,
    Metadata,
    Rule,
)
from contemplation.needs.tools import registry
from contemplation.protocol.conversation import history_marks, last_marker, whole
from contemplation.protocol.logformat import (
    NEED_PREFIX,
    RESPONSE_PREFIX,
    TOOL_CALL_OPEN,
    TOOL_CALL_RE,
    canonical_need,
)
from contemplation.protocol.structured import body as without_schema
from contemplation.store.templates import PromptMode

# The system prompt in canonical order: what every conversation shares first (this
# line and the protocol), then the template's words, then the conversation's own (its topic,
# then its context): a server that reuses a byte-identical prefix reuses all of it.
INTRO = "You are in an asynchronous conversation with {agent} (an AI agent or a person)."
ABOUT = "This conversation is about: {topic}."
STYLE = "Answer thoughtfully and concisely."
COMPLETE_RULE = """\
When the conversation has reached its goal and nothing more is needed, end your reply with a
line that says exactly:
=== COMPLETE ==="""
CANCELLED_NOTE = "(the agent cancelled this reply)"  # ends a cancelled turn in the history
MAX_OFFERED = 30  # need forms listed in the prompt at most
MAX_DESCRIPTION = 300  # a rule's description in the prompt
# the file rule's description names the readable folders (up to 8, whole) and the part form
MAX_FOLDERS_DESCRIPTION = 1500
FOLDERS_TOOL = "files.read"


@dataclass(frozen=True, slots=True)
class NeedForm:
    """One way of asking that a rule answers: what follows ``NEED: `` with ``<param>``
    placeholders, and what it gives (cut at a word end past ``limit`` characters)."""

    form: str
    description: str = ""
    limit: int = MAX_DESCRIPTION

    def line(self) -> str:
        """The form as the prompt lists it; its description, if any, on a line of its own
        (a model that copies the NEED line copies only the form)."""
        if not self.description:
            return f"  {NEED_PREFIX} {self.form}"
        return f"  {NEED_PREFIX} {self.form}\n      {_one_line(self.description, self.limit)}"


def _one_line(text: str, limit: int = MAX_DESCRIPTION) -> str:
    """``text`` on one line, at most ``limit`` characters: cut at a word end, marked "…"."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    space = flat.rfind(" ", 0, limit - 1)
    return flat[: space if space > limit // 2 else limit - 2].rstrip(" ,;:") + " …"


def need_forms(rules: Iterable[Rule], limit: int = MAX_OFFERED) -> tuple[NeedForm, ...]:
    """The need forms of ``rules`` (in matching order, the first of equal forms kept): a
    prefix rule as ``<prefix> <param>``, a pattern rule as a sketch of its pattern (else its
    description). At most ``limit``."""
    out: dict[str, NeedForm] = {}
    for rule in rules:
        if len(out) >= limit:
            break
        form = _form(rule)
        if form and form.casefold() not in out:
            cap = MAX_FOLDERS_DESCRIPTION if rule.tool == FOLDERS_TOOL else MAX_DESCRIPTION
            out[form.casefold()] = NeedForm(form, rule.description, cap)
    return tuple(out.values())


def _form(rule: Rule) -> str:
    if rule.pattern is None:
        return f"{rule.prefix} <{rule.param}>"
    sketch = sketch_pattern(rule.pattern.pattern)
    if sketch:
        return sketch
    return f"<{_one_line(rule.description).rstrip('.')}>" if rule.description else ""


_SKETCH_STEPS = (
    (re.compile(r"\(\?[aiLmsux]+\)"), ""),  # inline flags
    (re.compile(r"\(\?P<(\w+)>[^()]*\)[?*+]?"), r"<\1>"),  # a named capture
    (re.compile(r"\(\?:[^()]*\)[?*]"), ""),  # an optional group
    (re.compile(r"\(\?:([^()|]*)(?:\|[^()]*)?\)\+?"), r"\1"),  # a group: its first choice
)
_SPACES_RE = re.compile(r"\\s[+*]?| [+*]")
_ESCAPED_RE = re.compile(r"\\([^A-Za-z0-9])")
_LEFT_RE = re.compile(r"[()\[\]{}|*+?^$\\]")


def sketch_pattern(pattern: str) -> str:
    """What a need matching ``pattern`` looks like, for a person or a model: named captures
    become ``<name>``, optional groups go, a group keeps its first choice. "" when the
    pattern is beyond that (character classes, alternations at the top ...)."""
    text = pattern.removeprefix("^").removesuffix("$")
    for _ in range(len(text)):  # each round removes at least one group, or stops
        before = text
        for regex, repl in _SKETCH_STEPS:
            text = regex.sub(repl, text)
        if text == before:
            break
    text = _ESCAPED_RE.sub(r"\1", _SPACES_RE.sub(" ", text))
    if _LEFT_RE.search(text.replace("<", "").replace(">", "")):
        return ""
    return " ".join(text.split())


def protocol(needs: Sequence[NeedForm]) -> str:
    """How to ask for context (NEED lines: the forms a rule answers) and how to finish."""
    if not needs:
        asking = (
            "When you need something that you do not have, write a line that starts with\n"
            f'"{NEED_PREFIX} " followed by what you need, one per line, and stop; {{agent}} '
            f'answers in a\nblock that starts with "{RESPONSE_PREFIX}".'
        )
        return f"{asking}\n{COMPLETE_RULE}"
    lines = [
        "When you need context that you do not have, write a line that starts with "
        f'"{NEED_PREFIX} "',
        "followed by what you need, one per line, and stop; the answers come back in blocks that",
        f'start with "{RESPONSE_PREFIX}". You can ask for:',
        *(n.line() for n in needs),
        "Anything else you need, ask for the same way: {agent} answers it.",
        COMPLETE_RULE,
    ]
    return "\n".join(lines)


def system_prompt(
    meta: Metadata,
    template_prompt: str = "",
    *,
    prompt_mode: PromptMode = "add",
    needs: Sequence[NeedForm] | None = None,
    asking: bool = True,
) -> str:
    """The system prompt, in canonical order: the introduction and the protocol (how to
    write NEED lines, offering ``needs``, and COMPLETE), the same for every conversation;
    then the own prompt (metadata ``system_prompt``, else the template's); then the topic.
    With ``prompt_mode`` "replace" (the template's, or metadata ``prompt_mode``) the own
    prompt is the whole system prompt instead. Without ``asking`` (a reply held to a JSON
    Schema cannot hold a NEED line) there is no protocol.

    ``{agent}`` and ``{topic}`` are filled everywhere, ``{needs}`` in the own prompt (the
    offered NEED lines)."""
    offered = need_forms(registry.default_rules()) if needs is None else needs
    own = (meta.system_prompt or template_prompt).strip()
    chosen = (meta.model_extra or {}).get("prompt_mode")
    mode = chosen if chosen in ("add", "replace") else prompt_mode
    listed = "\n".join(n.line() for n in offered) if asking else ""
    own = own.replace("{needs}", listed)
    if mode == "replace" and own:
        text = own
    else:
        rules = protocol(offered) if asking else ""
        parts = (INTRO, rules, own or STYLE, ABOUT)
        text = "\n\n".join(part for part in parts if part)
    return text.replace("{agent}", meta.agent_label.title()).replace("{topic}", meta.topic)


def split_tool_calls(text: str) -> tuple[str, list[tuple[str, str, Any, str]]]:
    """A model block's text without its recorded native tool calls, and those calls.

    The turn writes each call as ``(tool call <id>: <name> <json arguments>)`` followed by
    the equivalent ``NEED:`` line; each call is (id, name, arguments, need).
    """
    if TOOL_CALL_OPEN not in text:
        return text, []
    calls = []
    for m in TOOL_CALL_RE.finditer(text):
        try:
            args: Any = json.loads(m.group(3))
        except ValueError:
            args = m.group(3)
        calls.append((m.group(1), m.group(2), args, canonical_need(m.group(4))))
    return TOOL_CALL_RE.sub("", text).strip("\n"), calls


def history(blocks: tuple[Block, ...]) -> list[ChatMessage]:
    """The log as chat messages; native tool calls go back as tool_calls + tool messages."""
    return [m for _, m in history_blocks(blocks)]


def cancelled(block: Block) -> bool:
    """The turn that followed ``block`` (a cut-off reply, or the agent's words before it) was
    cancelled by the agent: its CANCELLED marker is the last that says how it ended."""
    return last_marker(block) is MarkerKind.CANCELLED


NEEDS_SHOWN = 5  # of a long run of needs answered together, the first and last this many


def condensed_needs(text: str) -> str:
    """An answer block shared by many needs (the needs past a reply's limit: one line each,
    20,000 for a reply that asked for 20,000 things) as the model is sent it: the first and
    last few needs and how many between; the log keeps every line."""
    lines = text.split("\n")
    run = 0
    while run < len(lines) and lines[run].startswith(RESPONSE_PREFIX):
        run += 1
    if run <= 2 * NEEDS_SHOWN + 1:
        return text
    left = run - 2 * NEEDS_SHOWN
    return "\n".join(
        [
            *lines[:NEEDS_SHOWN],
            f"[… {left} more needs, answered together with these …]",
            *lines[run - NEEDS_SHOWN :],
        ]
    )


def history_blocks(blocks: tuple[Block, ...]) -> list[tuple[int, ChatMessage]]:
    """:func:`history` with the index of the block each message comes from (a block gives
    one message, and an agent's block a cancelled turn followed gives the note of it after
    its own), so the history budget can say which blocks a summary covers.

    A cancelled turn stays in the history as an assistant turn: its partial words (if any
    reached the log) and :data:`CANCELLED_NOTE`, so the model is never asked the cancelled
    question again in silence, nor sent two user turns in a row. A turn the agent withdrew
    (``RETRACTED``) is left out whole."""
    out: list[tuple[int, ChatMessage]] = []
    calls_by_need: dict[str, tuple[str, str]] = {}
    marks = history_marks(blocks)
    for i, b in enumerate(blocks):
        if i in marks.left_out:
            continue
        cut = i in marks.cancelled
        if b.kind is BlockKind.MODEL and cut:
            words = split_tool_calls(b.text.strip("\n"))[0]  # calls never made: left out
            note = f"{words}\n\n{CANCELLED_NOTE}" if words.strip() else CANCELLED_NOTE
            out.append((i, ChatMessage("assistant", note)))
            continue
        text = b.text.strip("\n")
        if b.kind is BlockKind.AGENT:
            text = condensed_needs(without_schema(text))  # the schema goes as the request's
            call = calls_by_need.pop(b.response_to, None) if b.response_to else None
            if call is not None:
                out.append((i, ChatMessage("tool", text, tool_call_id=call[0], tool_name=call[1])))
            else:  # the images its writer's [attachment: …] lines name go with it
                out.append((i, ChatMessage("user", text, images=b.images)))
            if cut:  # cancelled before the model wrote a word
                out.append((i, ChatMessage("assistant", CANCELLED_NOTE)))
            continue
        content, calls = split_tool_calls(text)
        if not calls and content and i in marks.carried and _goes_on(i, out):  # `continue`
            out[-1] = (i, ChatMessage("assistant", out[-1][1].content + content))
            continue
        calls_by_need = {need: (cid, name) for cid, name, _, need in calls}
        if calls:
            tool_calls = tuple(
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args, _ in calls
            )
            out.append((i, ChatMessage("assistant", content, tool_calls=tool_calls)))
        elif content:
            out.append((i, ChatMessage("assistant", content)))
    return out


def _goes_on(i: int, out: list[tuple[int, ChatMessage]]) -> bool:
    """Block ``i`` (a model's, :attr:`Marks.carried`) carries on the reply just before it in
    ``out``, which the agent asked the model to go on with (``GO ON``): the two are one
    assistant message, as the model wrote them."""
    if not out:
        return False
    last = out[-1][1]
    return out[-1][0] == i - 1 and last.role == "assistant" and not last.tool_calls


def message_count(blocks: Sequence[Block]) -> int:
    """How many messages :func:`history_blocks` makes of ``blocks``, counted without their
    text (the blocks a turn leaves unread: see :mod:`contemplation.prompt.reach`): a model block
    whose text is blank, which gives none, is counted as one."""
    n = 0
    for b in blocks:
        if b.kind is BlockKind.MODEL:
            n += 1 if cancelled(b) or whole(b) else 0
        else:
            n += 2 if cancelled(b) else 1
    return n


def build_request(
    meta: Metadata,
    blocks: tuple[Block, ...],
    *,
    template_prompt: str = "",
    prompt_mode: PromptMode = "add",
    needs: Sequence[NeedForm] | None = None,
    context: str = "",
    asking: bool = True,
) -> ChatRequest:
    """The request for the next reply: the system prompt (see :func:`system_prompt`), the
    assembled context after it, then the history."""
    system = system_prompt(
        meta, template_prompt, prompt_mode=prompt_mode, needs=needs, asking=asking
    )
    if context:
        system = f"{system}\n\n{context}"
    messages = [ChatMessage("system", system), *history(blocks)]
    return ChatRequest(
        model=meta.model,
        messages=tuple(messages),
        options=dict(meta.options),
        think=meta.think,
        conversation_id=meta.id,
    )
