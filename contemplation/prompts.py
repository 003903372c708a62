"""Pure: history + template → the chat request sent to a model."""

from __future__ import annotations

from contemplation.conversation import whole
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


def history(blocks: tuple[Block, ...]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for b in blocks:
        if not whole(b):
            continue
        text = b.text.strip("\n")
        if b.kind is BlockKind.AGENT:
            out.append(ChatMessage("user", text))
        elif text:
            out.append(ChatMessage("assistant", text))
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
