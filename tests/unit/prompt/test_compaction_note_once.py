"""A compaction's NOTE is written once, not at every turn after it: the
turn that first reuses a summary in the log says that the summary stands in for the older
messages; the turns after it, reusing the same summary, say nothing more. A new summary is
said again, once."""

from __future__ import annotations

from dataclasses import replace

from contemplation.models import Block, BlockKind, ChatMessage, ChatRequest, MarkerKind
from contemplation.prompt import budget
from contemplation.prompt.prompts import history_blocks

STANDS = "the summary above stands in for them"


def block(kind: BlockKind, text: str) -> Block:
    agent = kind is BlockKind.AGENT
    return Block(
        sender="CLAUDE" if agent else "OLLAMA",
        recipient="OLLAMA" if agent else "CLAUDE",
        timestamp="2026-11-26 03:00:00",
        kind=kind,
        text=text,
        offset=0,
        end=0,
    )


def history(turns: int, first: int = 0) -> list[Block]:
    out: list[Block] = []
    for i in range(first, first + turns):
        out.append(block(BlockKind.AGENT, f"question {i} " + "q" * 1400))
        out.append(block(BlockKind.MODEL, f"answer {i} " + "a" * 800))
    return out


def request_of(blocks: list[Block]) -> ChatRequest:
    msgs = [
        ChatMessage("system", "You are helpful."),
        *(m for _, m in history_blocks(tuple(blocks))),
    ]
    return ChatRequest(model="m", messages=tuple(msgs), options={"num_ctx": 2048})


def noted(b: Block, notes: tuple[str, ...] | list[str]) -> Block:
    return replace(b, markers=(*b.markers, *((MarkerKind.NOTE, n) for n in notes)))


def test_the_reused_summary_is_said_once_not_at_every_turn() -> None:
    blocks = [*history(4), block(BlockKind.AGENT, "question 4 " + "q" * 1400)]
    first = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    blocks[-1] = noted(blocks[-1], first.with_summary("Earlier: q and a.")[1])
    blocks += [block(BlockKind.MODEL, "ok"), block(BlockKind.AGENT, "short one")]
    again = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    assert again.summarise == () and again.notes[-1].endswith(STANDS)  # said, once
    blocks[-1] = noted(blocks[-1], again.notes)
    blocks += [block(BlockKind.MODEL, "fine"), block(BlockKind.AGENT, "another short one")]
    third = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    assert third.summarise == ()
    assert third.request.messages[0].content.endswith("Earlier: q and a.")  # still in use
    assert not [n for n in third.notes if n.endswith(STANDS)], third.notes  # not said again
    # a new compaction is said again, once
    blocks += history(3, first=10)
    blocks.append(block(BlockKind.AGENT, "last " + "q" * 1400))
    later = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    blocks[-1] = noted(blocks[-1], later.with_summary("All of it.")[1])
    blocks += [block(BlockKind.MODEL, "ok"), block(BlockKind.AGENT, "short")]
    after = budget.plan(request_of(blocks), 2048, blocks=blocks, reserve=512)
    assert after.summarise == () and after.notes[-1].endswith(STANDS)
