"""What waits for the agent: one list, the same on every face.

A conversation stopped at NEED lines waits for two different things, and they must never be
confused (an approval answered with chat text hands the model that text as a file):

* a **need** no rule could answer: the agent answers it with text (``respond``);
* a **lookup** a ``[permissions]`` rule marks ``ask``: the agent decides about it
  (``approve --once|--always|--reject``); its answer comes from the tool, never from the agent.

Each item has a stable id: the hash of its NEED line's reply and text (the id the daemon gives
an approval request), so an id never shifts when another item is answered, and a later reply
asking the same thing gets a new one. The log is the truth for what is unanswered; state.json
says which of those are lookups waiting for approval; answers already queued in ``inbox/`` or
``processing/`` and decisions already in metadata.json are on their way and not listed. The
documents are read as their models dump them (:mod:`contemplation.store.plain`), so a read
command lists what waits without loading the models.

A lookup the agent has decided about is never listed again, under either kind, whatever the
state says meanwhile: until the daemon has written its answer it is *deciding* (a face that
waits is not done), and a second decision about it is refused (:func:`decided_line`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from contemplation.base.terminal import safe
from contemplation.errors import InputRejected
from contemplation.protocol import panel
from contemplation.protocol.conversation import need_id, unanswered
from contemplation.store import plain
from contemplation.store.layout import Conv
from contemplation.values import Status, grants

if TYPE_CHECKING:
    from contemplation.models import ApprovalDecision

Doc = Mapping[str, Any]  # a document as its model dumps it (contemplation.store.plain)

Kind = Literal["need", "approval"]
Face = Literal["cli", "mcp", "agent"]  # "agent": the CLI run from an agent's shell
#: where a lookup waiting for approval is decided, as an agent is told it (never a command)
PERSON_DECIDES = (
    "the person decides it: in the form their MCP client shows, on the dashboard, or in their "
    "own terminal"
)

#: statuses in which the daemon is at work on the needs (looking them up with their rules):
#: answering one by hand then would race the rule, so no need is listed
_AT_WORK = frozenset({Status.ROUTING, Status.GENERATING, Status.RETRYING})
MIN_PREFIX = 4  # an id may be shortened to a unique prefix this long


@dataclass(frozen=True, slots=True)
class WaitItem:
    id: str
    kind: Kind
    need: str
    tool: str = ""  # for a lookup: the tool, its arguments and the permission that asks
    arguments: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    def as_dict(self, conv_id: str, face: Face) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "need": self.need}
        if self.kind == "approval":
            out |= {"tool": self.tool, "arguments": self.arguments, "why": self.why}
        out["how"] = how(self, conv_id, face)
        return out


def how(item: WaitItem, conv_id: str, face: Face) -> str:
    """The exact command (CLI) or tool call (MCP) that settles ``item``; to an agent running
    the CLI, a lookup's approval is named as the person's, with no command to paste."""
    if face == "mcp":
        if item.kind == "need":
            return (
                f'conversation_respond(conversation_id="{conv_id}", need="{item.id}", response="…")'
            )
        return (
            f'conversation_approve(conversation_id="{conv_id}", need="{item.id}", '
            'decision="once|always|reject")'
        )
    if item.kind == "need":
        return f'contemplation respond {conv_id} "…" --need {item.id}'
    if face == "agent":
        return PERSON_DECIDES
    return f"contemplation approve {conv_id} --need {item.id} --once|--always|--reject"


@dataclass(frozen=True, slots=True)
class Look:
    """What one reading of a conversation says waits: ``items`` for the agent, and
    ``deciding``, the lookups the agent has decided about whose answers the daemon has not
    written yet (their ids)."""

    items: list[WaitItem] = field(default_factory=list)
    deciding: tuple[str, ...] = ()


def look(
    conv: Conv,
    blocks: Sequence[Any],
    meta: Doc | None,
    state: Doc | None,
    queued: set[str],
    *,
    decided: bool = False,
) -> Look:
    """What waits, from the parsed log's ``blocks``, the conversation's documents as their
    models dump them (:func:`plain.metadata`, :func:`plain.state`) and the needs whose answers
    are ``queued`` (see :meth:`~contemplation.faces.reading.Reader.standing`). ``decided``:
    also list the lookups decided in metadata.json that the daemon has not acted on yet (so
    that a second decision can name the first)."""
    if conv.is_completed or meta is None:
        return Look()
    log = tuple(blocks)
    seat, nxt = panel.next_for(meta, log)  # in a panel: the seat whose needs wait
    if nxt.action != "needs":
        return Look()
    block, _ = unanswered(panel.seen(meta, log, seat))
    asked = {r["id"]: r for r in state["pending_approvals"]} if state is not None else {}
    given = plain.approvals(meta)
    handed_over = state is None or state["status"] not in _AT_WORK
    out: list[WaitItem] = []
    deciding: list[str] = []
    for need in nxt.needs:
        if need in queued:
            continue
        rid = need_id(block, need)
        request = asked.get(rid)
        if deciding_for(rid, request, given) is not None:
            deciding.append(rid)  # on its way: never a need, and a lookup only to name it
            if decided and request is not None:
                out.append(_lookup(request))
        elif request is not None:
            out.append(_lookup(request))
        elif handed_over:
            out.append(WaitItem(rid, "need", need))
    return Look(out, tuple(deciding))


def _lookup(request: Doc) -> WaitItem:
    return WaitItem(
        request["id"],
        "approval",
        request["need"],
        request["tool"],
        request["arguments"],
        request["why"],
    )


def deciding_for(rid: str, request: Doc | None, given: Sequence[Doc]) -> Doc | None:
    """The decision that settles lookup ``rid`` (its request and the decisions, as their
    models dump them): its own (the first: decisions are final), else an ``always`` one for the
    same tool and arguments; None when it is undecided."""
    own = next((d for d in given if d["request"] == rid), None)
    if own is not None or request is None:
        return own
    return next(
        (
            d
            for d in given
            if grants(d["decision"], d["revoked"])
            and d["tool"] == request["tool"]
            and d["arguments"] == request["arguments"]
        ),
        None,
    )


VERBS = {"once": "approved once", "always": "approved always", "reject": "rejected"}


def decided_line(rid: str, need: str, d: ApprovalDecision) -> str:
    """The one line that refuses a second decision: what the first one was, by which face and
    when."""
    by = f" by {d.by}" if d.face else ""
    at = f" at {d.time}" if d.time else ""
    via = "" if d.request == rid else f" (the decision about lookup {d.request})"
    return safe(
        f"lookup {rid} ({need}) was decided already: {VERBS[d.decision]}{by}{at}{via}; "
        "a decision is final"
    )


def pick(conv_id: str, waiting: list[WaitItem], ref: str, want: Kind, face: Face) -> WaitItem:
    """The item ``ref`` names (its id, a unique prefix of at least MIN_PREFIX characters, or
    its need's text), which must be of kind ``want``: a need is answered, a lookup decided,
    and naming one to the other's command is refused with the command that fits."""
    ref = ref.strip()
    hits = [i for i in waiting if ref in {i.id, i.need}]
    if not hits and len(ref) >= MIN_PREFIX:
        hits = [i for i in waiting if i.id.startswith(ref)]
    if len(hits) > 1:
        raise InputRejected(f"{ref!r} names {len(hits)} items; use the full id — {listed(hits)}")
    if not hits:
        if not waiting:
            raise InputRejected(f"{conv_id} waits for nothing from the agent; nothing is {ref!r}")
        raise InputRejected(f"nothing waiting in {conv_id} is {ref!r}; waiting: {listed(waiting)}")
    item = hits[0]
    if item.kind != want:
        raise InputRejected(wrong_kind(conv_id, item, face))
    return item


def choose(
    conv_id: str, waiting: list[WaitItem], ref: str | None, want: Kind, face: Face
) -> WaitItem | None:
    """The item an action settles: the one ``ref`` names, else the only one of kind
    ``want``; None when nothing waits at all. Several of that kind with none named, or only
    items of the other kind, are refused with what waits and the command that fits."""
    if ref:
        return pick(conv_id, waiting, ref, want, face)
    mine = [i for i in waiting if i.kind == want]
    if len(mine) == 1:
        return mine[0]
    if mine:
        what = "needs wait" if want == "need" else "lookups wait for approval"
        raise InputRejected(
            f"{len(mine)} {what} in {conv_id}; name the one (need) — {listed(mine)}"
        )
    if not waiting:
        return None
    other = waiting[0]
    if want == "need":
        send = "plain=true" if face == "mcp" else f"`contemplation send {conv_id} … --plain`"
        raise InputRejected(
            f"{conv_id} waits for the approval of {len(waiting)} lookup(s), not for an answer "
            f"(the tool answers a lookup, never the agent's text). {_decide(other, conv_id, face)}"
            f"; to send a message anyway, use {send}"
        )
    raise InputRejected(
        f"{conv_id} waits for no approval: the model waits for an answer to "
        f"{len(waiting)} need(s). Answer with {how(other, conv_id, face)}"
    )


def _decide(item: WaitItem, conv_id: str, face: Face) -> str:
    said = how(item, conv_id, face)
    return said[0].upper() + said[1:] if face == "agent" else f"Decide with {said}"


def wrong_kind(conv_id: str, item: WaitItem, face: Face) -> str:
    if item.kind == "approval":
        return (
            f"{item.id} is a lookup waiting for approval ({item.tool} for {item.need!r}), not "
            "a need to answer: its answer comes from the tool. " + _decide(item, conv_id, face)
        )
    return (
        f"{item.id} is a need to answer ({item.need!r}), not a lookup to approve. "
        f"Answer with {how(item, conv_id, face)}"
    )


def still(left: Sequence[dict[str, Any]]) -> list[str]:
    """``still waiting: ID (kind) need`` for each item an action left (as dicts)."""
    return [safe(f"still waiting: {i['id']} ({i['kind']}) {i['need']}") for i in left]


def listed(waiting: Sequence[WaitItem]) -> str:
    return "; ".join(f"{i.id} ({i.kind}): {i.need}" for i in waiting)


def lines(conv_id: str, waiting: Sequence[WaitItem], face: Face = "cli") -> list[str]:
    """Each item and the command for it, as ``send --wait``, ``status`` and ``wait`` print
    them (a line of what, an indented line of how)."""
    needs = [i for i in waiting if i.kind == "need"]
    asks = [i for i in waiting if i.kind == "approval"]
    out: list[str] = []
    if needs:
        out.append(f"the model waits for {len(needs)} answer(s) no rule could give:")
        for i in needs:
            out.append(f"  need {i.id}: {i.need}")
            out.append(f"    {how(i, conv_id, face)}")
    if asks:
        out.append(f"the model waits for {len(asks)} lookup(s) to be approved:")
        for i in asks:
            args = json.dumps(i.arguments, ensure_ascii=False)
            out.append(f"  lookup {i.id}: {i.need}  ({i.tool} {args})")
            out.append(f"    {how(i, conv_id, face)}")
    return [safe(line) for line in out]
