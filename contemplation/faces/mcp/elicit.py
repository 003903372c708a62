"""Approvals are the person's: a lookup a ``[permissions]`` rule marks ``ask`` is put to the
person as an elicitation form (allow once / allow always / reject, with what will be read and
why) by a client that takes forms, and their answer is the decision, recorded as
``conversation_approve`` records one (:func:`contemplation.faces.actions.approve`: under the
faces' lock, the first decision about a lookup wins). A form is never answered by the agent's
chat text: it goes to the client, which shows it to the person.

Two ways in: a task's ``inputRequests`` (:mod:`contemplation.faces.mcp.tasks`, answered with
``tasks/update``), and, outside tasks, :func:`wait_asking`: while ``conversation_wait`` waits,
each lookup that waits for approval is sent as an ``elicitation/create`` request on the
call's back channel, and the wait goes on with the decision made. A client that takes no
forms (or has no back channel) keeps today's contract: ``waiting`` names conversation_approve.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp_types import ElicitResult

from contemplation.errors import ContemplationError
from contemplation.faces import actions
from contemplation.faces.mcp.calls import Faces

CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
MAX_ASKS = 16  # forms one conversation_wait puts to the person, at most
ASK_TIMEOUT = 600.0  # seconds a person has to answer one form (then it is left undecided)


def elicits(meta: Any) -> bool:
    """Whether the request's client takes elicitation forms (``elicitation: {}`` is form)."""
    caps = meta.get(CAPABILITIES_KEY) if isinstance(meta, dict) else None
    got = caps.get("elicitation") if isinstance(caps, dict) else None
    return isinstance(got, dict) and ("form" in got or not got)


DECISION_SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "oneOf": [
                {"const": "once", "title": "Allow once"},
                {"const": "always", "title": "Allow always (this tool, these arguments, here)"},
                {"const": "reject", "title": "Reject (the model is told it was refused)"},
            ],
        }
    },
    "required": ["decision"],
}


def approval_form(item: dict[str, Any], model: str) -> dict[str, Any]:
    """The elicitation form that asks the person about one lookup (a ``waiting`` item)."""
    args = json.dumps(item.get("arguments", {}), ensure_ascii=False)
    message = (
        f"The local model ({model or 'model'}) asks to run {item.get('tool')} {args} "
        f"for: {item.get('need')}. Asked because {item.get('why') or 'a rule says ask'}. "
        "Allow it?"
    )
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": DECISION_SCHEMA},
    }


def takes_forms(ctx: Context[Any, Any]) -> bool:
    """Whether the client of this call takes form elicitation and can be asked now: declared
    on the request (2026-07-28) or at initialize, with a back channel open."""
    return ctx.request_context.session.can_send_request and shows_forms(ctx)


def shows_forms(ctx: Context[Any, Any]) -> bool:
    """Whether the client of this call shows the person forms at all (declared on the
    request or at initialize), back channel or not: a task's ``inputRequests`` need none.
    Such a client's person decides the lookups (:func:`contemplation.faces.actions.
    agent_may_approve`)."""
    rc = ctx.request_context
    if elicits(rc.meta):
        return True
    caps = rc.session.client_capabilities
    got = caps.elicitation if caps is not None else None
    return got is not None and (got.form is not None or got.url is None)


def _decision(result: ElicitResult) -> str | None:
    if result.action == "decline":
        return "reject"
    got = (result.content or {}).get("decision") if result.action == "accept" else None
    return got if isinstance(got, str) and got in actions.DECISIONS else None


async def ask(
    faces: Faces,
    ctx: Context[Any, Any],
    out: dict[str, Any],
    asked: set[str],
    deadline: float | None = None,
) -> tuple[int, list[str]]:
    """Put each lookup of ``out["waiting"]`` not asked yet to the person; record their
    decisions. Returns how many were decided here (a form cancelled, or a lookup another
    face decided first, is not) and the ids of forms left unanswered when ``deadline`` (in
    ``anyio.current_time()``) came: the person's answer is not waited for past it."""
    rc = ctx.request_context
    cid = str(out.get("conversation_id"))
    decided = 0
    for item in out.get("waiting", []):
        if item.get("kind") != "approval" or str(item.get("id")) in asked:
            continue
        if len(asked) >= MAX_ASKS:
            break
        left = ASK_TIMEOUT if deadline is None else deadline - anyio.current_time()
        if left <= 0:
            return decided, [str(item.get("id"))]
        asked.add(str(item.get("id")))
        form = approval_form(item, str(out.get("model", "")))["params"]
        with anyio.move_on_after(min(left, ASK_TIMEOUT)) as scope:
            result = await rc.session.elicit_form(
                form["message"], form["requestedSchema"], related_request_id=rc.request_id
            )
        if scope.cancelled_caught:  # the person has not answered: the wait keeps its bound
            return decided, [str(item.get("id"))]
        decision = _decision(result)
        if decision is not None and await anyio.to_thread.run_sync(
            _record, faces, cid, decision, str(item.get("id"))
        ):
            decided += 1
    return decided, []


def _record(faces: Faces, cid: str, decision: str, request: str) -> bool:
    try:
        with faces.lock:
            conv = faces.reader.locate(cid)
            actions.approve(
                faces.settings, conv, decision, request, reader=faces.reader, face="form"
            )
    except ContemplationError:
        return False  # decided already (the first decision wins), or gone
    return True


async def wait_asking(
    faces: Faces,
    ctx: Context[Any, Any],
    wait: Callable[[float], Awaitable[dict[str, Any]]],
    timeout_s: float,
) -> dict[str, Any]:
    """``conversation_wait`` for a client that takes forms: each lookup that waits for
    approval is asked of the person, and once one is decided the wait goes on (within the
    same ``timeout_s``) so the reply it lets through comes back in this call. A form still
    unanswered when ``timeout_s`` is up is left open: the wait returns in its bound, with
    ``forms_pending`` and a hint saying what to call next."""
    deadline = anyio.current_time() + timeout_s
    out = await wait(timeout_s)
    asked: set[str] = set()
    while len(asked) < MAX_ASKS:
        decided, pending = await ask(faces, ctx, out, asked, deadline)
        left = deadline - anyio.current_time()
        if pending:
            return _still_pending(out, pending)
        if not decided or left <= 0:
            break
        out = await wait(left)
    return out


def _still_pending(out: dict[str, Any], pending: list[str]) -> dict[str, Any]:
    """The wait's result when the person has not answered a form in time: the lookups it
    asked about are named as pending, with what to call next."""
    cid = str(out.get("conversation_id"))
    out["timed_out"] = True
    out["forms_pending"] = pending
    out["hint"] = (
        f"The person has not answered the form about {len(pending)} lookup(s) yet; it is left "
        "open and nothing is decided. Call conversation_wait again with the returned cursor "
        "(the form is put to the person again); the person may also decide on the dashboard "
        f"or in their own terminal ({cid})."
    )
    return out
