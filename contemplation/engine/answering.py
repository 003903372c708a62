"""The answer cycle: NEED lines of a model reply → RESPONSE TO NEED blocks.

Tools run outside the conversation's lock (a tool may take seconds, and people appending by
hand must not wait on it); the lock is taken again to append the answers, after checking the
needs are still unanswered. A need no rule matches is left to the agent (``awaiting_agent``).
Each need is routed once, when the step plans the lookups; the needs past a reply's
``needs_per_reply`` are never routed and share one "limit reached" block, so a reply with
20,000 NEED lines costs a handful of appends, not 20,000.

Permissions: :func:`plan` marks each route allow / ask / deny (``[permissions]``, then the
agent's decisions in metadata.json ``approvals``). A denied or rejected need gets an answer
that says so and the model carries on; an asked one is not looked up: it becomes an
:class:`~contemplation.models.ApprovalRequest` in state.json (``pending_approvals``) and the
conversation waits in ``awaiting_approval`` until the agent decides (``contemplation
approve``), which rewrites metadata.json and so wakes the daemon. A ``RESPONSE TO NEED``
block for such a lookup, written by hand or dropped in ``inbox/``, is no answer
(:func:`~contemplation.protocol.conversation.awaiting`): it stays in the log as written, the
lookup still waits, and :func:`answer` says so once in a NOTE after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, replace

import structlog

from contemplation.engine.runtime import Runtime, lock
from contemplation.engine.steps import AGAIN, NeedsDue, Outcome, Wait
from contemplation.engine.tracking import Tracked
from contemplation.errors import ConfigError, ErrorKind
from contemplation.models import (
    ApprovalDecision,
    ApprovalRequest,
    Block,
    ConvEvent,
    MarkerKind,
    Metadata,
    Route,
    Status,
)
from contemplation.protocol import panel
from contemplation.protocol.conversation import (
    DISOWNED,
    answered_by_hand,
    awaiting,
    need_id,
    next_action,
    turn_start,
    unanswered,
)
from contemplation.protocol.panel import Seated, seated
from contemplation.store.layout import Conv, inbox_entries
from contemplation.writer import ConvWriter

log = structlog.get_logger("contemplation.answering")


@dataclass(frozen=True, slots=True)
class Plan:
    """What the step does with a reply's needs: look some up (``due``, None: nothing to look
    up or refuse now) and ask the agent about others (``asked``)."""

    due: NeedsDue | None
    asked: tuple[ApprovalRequest, ...] = ()


def _granted(rt: Runtime, found: Route, given: Iterable[ApprovalDecision]) -> bool:
    """An ``always`` covers the same lookup however it is spelt (the same file)."""
    router = rt.need_router()
    key = router.grant_key(found.tool, found.arguments)
    return key is not None and any(
        d.grants and router.grant_key(d.tool, d.arguments) == key for d in given
    )


def _permitted(
    rt: Runtime,
    meta: Metadata,
    block: Block | None,
    found: Route,
    given: list[ApprovalDecision],
) -> tuple[Route, ApprovalRequest | None]:
    """The route marked with its permission and the agent's decision about it."""
    verdict = rt.need_router().permit(found, template=meta.template)
    if verdict.action == "allow":
        return found, None
    if verdict.action == "deny":
        shown = verdict.rule.shown() if verdict.rule is not None else ""
        why = f"refused by configuration: the permissions deny {found.tool} here ({shown})"
        return replace(found, verdict="deny", why=why), None
    rid = need_id(block, found.need)
    decided = next((d for d in reversed(given) if d.request == rid), None)
    if decided is not None and decided.decision == "reject":
        why = f"the agent did not approve this lookup ({found.tool})"
        return replace(found, verdict="deny", why=why), None
    if decided is not None or _granted(rt, found, given):
        return replace(found, verdict="allow", why="approved by the agent"), None
    request = ApprovalRequest(
        id=rid,
        need=found.need,
        rule=found.rule.name,
        tool=found.tool,
        arguments=dict(found.arguments),
        why=verdict.why(),
    )
    return replace(found, verdict="ask", why=verdict.why()), request


def plan(rt: Runtime, meta: Metadata, blocks: tuple[Block, ...], needs: tuple[str, ...]) -> Plan:
    """What to look up now and what to ask the agent about; ``Plan(None)`` when only the
    agent can answer."""
    try:
        routes = rt.need_router().plan_routes(needs, template=meta.template)
    except ConfigError as exc:
        log.error("routing_rules_broken", conv=meta.id, error=str(exc))  # noqa: TRY400 - the message is the whole story
        return Plan(None)
    block, _ = unanswered(blocks)
    given = meta.approvals()
    marked: list[Route | None] = []
    asked: list[ApprovalRequest] = []
    for found in routes:
        if found is None:
            marked.append(None)
            continue
        route, request = _permitted(rt, meta, block, found, given)
        marked.append(route)
        if request is not None:
            asked.append(request)
    only_asked = all(r is None or r.verdict == "ask" for r in marked) and len(needs) <= len(marked)
    # a lookup waiting for approval answered by hand: :func:`answer` says it is no answer
    if only_asked and not answered_by_hand(blocks, {r.id for r in asked}):
        return Plan(None, tuple(asked))
    return Plan(
        NeedsDue(meta, needs, f"{meta.id}@{turn_start(blocks)}", tuple(marked)), tuple(asked)
    )


async def _still_asked(conv: Conv, seen: Tracked, w: ConvWriter, found: Seated) -> tuple[str, ...]:
    """The needs the log still shows unanswered (for the seat that asked, in a panel)."""
    now = (await seen.view(conv, found.meta.agent_label).refreshed(fd=w.fd)).blocks
    after = next_action(panel.view(found.meta, now, found.seat) if found.seat else now)
    return after.needs if after.action == "needs" else ()


async def answer(conv: Conv, rt: Runtime, seen: Tracked, due: NeedsDue) -> Outcome:
    meta = due.meta
    answered = await rt.need_router().answer_all(
        due.needs,
        conv_id=conv.id,
        turn_key=due.turn_key,
        template=meta.template,
        routes=due.routes,
    )
    asked = {r.need for r in due.routes if r is not None and r.verdict == "ask"}
    stack, w = await lock(conv, rt, meta)
    with stack:
        parsed = await seen.view(conv, meta.agent_label).refreshed()
        held = awaiting(w.state, w.meta)
        found = seated(w.meta, parsed.blocks, held)
        if found.nxt.action != "needs" or found.meta.sender_label() != meta.sender_label():
            return AGAIN  # answered meanwhile (or, in a panel, another seat's are due)
        nxt, blocks = found.nxt, found.blocks
        for rid, need in answered_by_hand(blocks, held):
            w.append_marker(
                MarkerKind.NOTE,
                f"{DISOWNED} {rid}: it waits for approval, and only its tool answers it once "
                "the person decided (in the form their MCP client shows, on the dashboard, or "
                "in their own terminal)",
            )
            log.warning("hand_answer_to_a_lookup", conv=conv.id, request=rid, need=need)
        still = set(nxt.needs)
        model_block, _ = unanswered(blocks)
        # unique across rotated segments: offsets restart in each messages.log, inodes do not
        base = f"need-{w.state.log.ino}-{model_block.offset if model_block is not None else 0}"
        cap = len(due.routes)
        # an answer's id is its need's place in the reply: the needs of one reply may be
        # answered over several rounds (some wait for approval), and an id is used once
        asked_in = list(model_block.needs) if model_block is not None else []
        left: list[str] = []
        for i, (need, ans) in enumerate(answered[:cap]):
            if need not in still:
                continue
            if ans is None:
                if need not in asked:
                    left.append(need)
                continue
            block = ans.render_block(need)
            w.read_for_model(len(block.encode()))  # read for the model: the agent never had to
            at = w.append_block(
                meta.agent_label,
                meta.sender_label(),
                block,
                msg_id=f"{base}-{asked_in.index(need) if need in asked_in else i}",
            )
            if at < 0:  # in the log already: counted then
                w.read_for_model(-len(block.encode()))
            rt.notify(conv.id, ConvEvent.NEED_ANSWERED, need=need, tool=ans.tool, status=ans.status)
            await asyncio.sleep(0)  # a batch of appends never holds the loop
        over = [need for need, _ in answered[cap:] if need in still]
        limit = answered[cap].answer if len(answered) > cap else None
        if over and limit is not None:
            block = limit.render_block(*over)
            w.read_for_model(len(block.encode()))
            at = w.append_block(
                meta.agent_label,
                meta.sender_label(),
                block,
                msg_id=f"{base}-over",
            )
            if at < 0:
                w.read_for_model(-len(block.encode()))
            rt.notify(
                conv.id,
                ConvEvent.NEED_ANSWERED,
                need=f"{len(over)} needs",
                tool=limit.tool,
                status=limit.status,
            )
        # a need the log still shows unanswered would be looked up again forever: stop instead
        waiting = still.difference(left).difference(asked)
        stuck = waiting.intersection(await _still_asked(conv, seen, w, found))
        if stuck:
            log.error("answer_not_matched", conv=conv.id, needs=len(stuck))
            w.record_error(
                ErrorKind.INTERNAL,
                f"{len(stuck)} answers were written but do not match their NEED lines; "
                "answer them with `contemplation respond`",
                status=Status.AWAITING_AGENT,
            )
            return Wait(None)
        if asked.intersection(still):
            return AGAIN  # the step records what waits for approval and says so
        if left:
            w.show(Status.AWAITING_AGENT, tuple(left))
            log.info("awaiting_agent", conv=conv.id, needs=len(left))
            rt.notify(conv.id, ConvEvent.AWAITING_AGENT, needs=left)
            # the agent may have answered already (while a lookup waited for approval): its
            # answer in inbox/ would otherwise wait for the next rescan
            return AGAIN if inbox_entries(conv) else Wait(None)
        return AGAIN
