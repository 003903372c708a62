"""The answer cycle: NEED lines of a model reply → RESPONSE TO NEED blocks.

Tools run outside the conversation's lock (a tool may take seconds, and people appending by
hand must not wait on it); the lock is taken again to append the answers, after checking the
needs are still unanswered. A need no rule matches is left to the agent (``awaiting_agent``).
Each need is routed once, when the step plans the lookups; the needs past a reply's
``needs_per_reply`` are never routed and share one "limit reached" block, so a reply with
20,000 NEED lines costs a handful of appends, not 20,000.
"""

from __future__ import annotations

import asyncio

import structlog

from contemplation.conversation import next_action, turn_start, unanswered
from contemplation.errors import ConfigError, ErrorKind
from contemplation.layout import Conv
from contemplation.models import Block, Metadata, Status
from contemplation.runtime import Runtime, lock, set_status
from contemplation.steps import AGAIN, NeedsDue, Outcome, Wait
from contemplation.tracking import Tracked

log = structlog.get_logger("contemplation.needs.cycle")


def plan(
    rt: Runtime, meta: Metadata, blocks: tuple[Block, ...], needs: tuple[str, ...]
) -> NeedsDue | None:
    """What to look up now, or None when only the agent can answer."""
    try:
        routes = tuple(rt.need_router().plan_routes(needs, template=meta.template))
    except ConfigError as exc:
        log.error("routing_rules_broken", conv=meta.id, error=str(exc))  # noqa: TRY400 - the message is the whole story
        return None
    if all(r is None for r in routes) and len(needs) <= len(routes):
        return None
    return NeedsDue(meta, needs, f"{meta.id}@{turn_start(blocks)}", routes)


async def answer(conv: Conv, rt: Runtime, seen: Tracked, due: NeedsDue) -> Outcome:
    meta = due.meta
    answered = await rt.need_router().answer_all(
        due.needs,
        conv_id=conv.id,
        turn_key=due.turn_key,
        template=meta.template,
        routes=due.routes,
    )
    stack, w = await lock(conv, rt, meta)
    with stack:
        parsed = seen.view(conv, meta.agent_label).refresh()
        nxt = next_action(parsed.blocks)
        if nxt.action != "needs":
            return AGAIN
        still = set(nxt.needs)
        model_block, _ = unanswered(parsed.blocks)
        # unique across rotated segments: offsets restart in each messages.log, inodes do not
        base = f"need-{w.state.log.ino}-{model_block.offset if model_block is not None else 0}"
        cap = len(due.routes)
        left: list[str] = []
        for i, (need, ans) in enumerate(answered[:cap]):
            if need not in still:
                continue
            if ans is None:
                left.append(need)
                continue
            w.append_block(
                meta.agent_label, meta.sender_label(), ans.render_block(need), msg_id=f"{base}-{i}"
            )
            rt.notify(conv.id, "need_answered", need=need, tool=ans.tool, status=ans.status)
            await asyncio.sleep(0)  # a batch of appends never holds the loop
        over = [need for need, _ in answered[cap:] if need in still]
        limit = answered[cap].answer if len(answered) > cap else None
        if over and limit is not None:
            w.append_block(
                meta.agent_label,
                meta.sender_label(),
                limit.render_block(*over),
                msg_id=f"{base}-over",
            )
            rt.notify(
                conv.id,
                "need_answered",
                need=f"{len(over)} needs",
                tool=limit.tool,
                status=limit.status,
            )
        # a need the log still shows unanswered would be looked up again forever: stop instead
        after = next_action(seen.view(conv, meta.agent_label).refresh().blocks)
        stuck = still.difference(left).intersection(after.needs if after.action == "needs" else ())
        if stuck:
            log.error("answer_not_matched", conv=conv.id, needs=len(stuck))
            w.record_error(
                ErrorKind.INTERNAL,
                f"{len(stuck)} answers were written but do not match their NEED lines; "
                "answer them with `contemplation respond`",
                status=Status.AWAITING_AGENT,
            )
            return Wait(None)
        if left:
            set_status(w, Status.AWAITING_AGENT, tuple(left))
            log.info("awaiting_agent", conv=conv.id, needs=len(left))
            rt.notify(conv.id, "awaiting_agent", needs=left)
            return Wait(None)
        return AGAIN
