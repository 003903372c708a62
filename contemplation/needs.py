"""The answer cycle: NEED lines of a model reply → RESPONSE TO NEED blocks.

Tools run outside the conversation's lock (a tool may take seconds, and people appending by
hand must not wait on it); the lock is taken again to append the answers, after checking the
needs are still unanswered. A need no rule matches is left to the agent (``awaiting_agent``).
"""

from __future__ import annotations

from dataclasses import dataclass

from contemplation.conversation import next_action, turn_start, unanswered
from contemplation.layout import Conv
from contemplation.models import Block, Metadata, Status
from contemplation.runtime import AGAIN, Runtime, Wait, lock, log, set_status


@dataclass(frozen=True, slots=True)
class NeedsDue:
    meta: Metadata
    needs: tuple[str, ...]
    turn_key: str


def routable(rt: Runtime, meta: Metadata, needs: tuple[str, ...]) -> tuple[str, ...]:
    """The needs some rule (other than "ask the agent") can answer."""
    r = rt.need_router()
    out = []
    for n in needs:
        found = r.route(n, template=meta.template)
        if found is not None and found.tool != "agent":
            out.append(n)
    return tuple(out)


def plan(
    rt: Runtime, meta: Metadata, blocks: tuple[Block, ...], needs: tuple[str, ...]
) -> NeedsDue | None:
    """What to look up now, or None when only the agent can answer."""
    if not routable(rt, meta, needs):
        return None
    return NeedsDue(meta, needs, f"{meta.id}@{turn_start(blocks)}")


async def answer(conv: Conv, rt: Runtime, due: NeedsDue) -> Wait | object:
    meta = due.meta
    answered = await rt.need_router().answer_all(
        due.needs, conv_id=conv.id, turn_key=due.turn_key, template=meta.template
    )
    stack, w = await lock(conv, rt, meta)
    with stack:
        parsed = rt.view(conv, meta.agent_label).refresh()
        nxt = next_action(parsed.blocks)
        if nxt.action != "needs":
            return AGAIN
        model_block, _ = unanswered(parsed.blocks)
        base = model_block.offset if model_block is not None else 0
        left: list[str] = []
        for i, (need, ans) in enumerate(answered):
            if need not in nxt.needs:
                continue
            if ans is None:
                left.append(need)
                continue
            w.append_block(
                meta.agent_label,
                meta.sender_label(),
                ans.render_block(need),
                msg_id=f"need-{base}-{i}",
            )
            rt.notify(conv.id, "need_answered", need=need, tool=ans.tool, status=ans.status)
        if left:
            set_status(w, Status.AWAITING_AGENT, tuple(left))
            log.info("awaiting_agent", conv=conv.id, needs=len(left))
            rt.notify(conv.id, "awaiting_agent", needs=left)
            return Wait(None)
        return AGAIN
