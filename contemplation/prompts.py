"""Pure: history + template → the chat request sent to a model."""

from __future__ import annotations

import json
import re
from typing import Any

from contemplation.conversation import whole
from contemplation.logformat import canonical_need
from contemplation.models import Block, BlockKind, ChatMessage, ChatRequest, Metadata

PROTOCOL = """\
You are in an asynchronous conversation with {agent} (an AI agent or a person), about: {topic}.
Answer thoughtfully and concisely. When you need context that you do not have, write a line
that starts with "NEED: " followed by what you need, one per line, and stop; the answers come
back in blocks that start with "RESPONSE TO NEED:". You can ask for:
  NEED: Brain memory about <topic>
  NEED: Obsidian notes matching <query>
  NEED: File contents of <path>
  NEED: Search results for <query>
  NEED: Current state of <thing>
When the conversation has reached its goal and nothing more is needed, end your reply with a
line that says exactly:
=== COMPLETE ==="""


def system_prompt(meta: Metadata, template_prompt: str) -> str:
    base = meta.system_prompt or template_prompt or PROTOCOL
    return base.replace("{agent}", meta.agent_label.title()).replace("{topic}", meta.topic)


TOOL_CALL_RE = re.compile(r"^\(tool call (\S+): (\S+) (.*)\)\nNEED: (.*)$", re.MULTILINE)


def split_tool_calls(text: str) -> tuple[str, list[tuple[str, str, Any, str]]]:
    """A model block's text without its recorded native tool calls, and those calls.

    The turn writes each call as ``(tool call <id>: <name> <json arguments>)`` followed by
    the equivalent ``NEED:`` line; each call is (id, name, arguments, need).
    """
    if "(tool call " not in text:
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


def history_blocks(blocks: tuple[Block, ...]) -> list[tuple[int, ChatMessage]]:
    """:func:`history` with the index of the block each message comes from (a block gives
    at most one message), so the history budget can say which blocks a summary covers."""
    out: list[tuple[int, ChatMessage]] = []
    calls_by_need: dict[str, tuple[str, str]] = {}
    for i, b in enumerate(blocks):
        if not whole(b):
            continue
        text = b.text.strip("\n")
        if b.kind is BlockKind.AGENT:
            call = calls_by_need.pop(b.response_to, None) if b.response_to else None
            if call is not None:
                out.append((i, ChatMessage("tool", text, tool_call_id=call[0], tool_name=call[1])))
            else:
                out.append((i, ChatMessage("user", text)))
            continue
        content, calls = split_tool_calls(text)
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


def build_request(
    meta: Metadata, blocks: tuple[Block, ...], *, template_prompt: str = "", context: str = ""
) -> ChatRequest:
    system = system_prompt(meta, template_prompt)
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


def estimate_tokens(request: ChatRequest) -> int:
    """A cheap estimate (about 4 characters a token for English text)."""
    chars = sum(len(m.content) for m in request.messages)
    return chars // 4 + 4 * len(request.messages)
