"""The decisions made about lookups at run time, listed and revocable.

Each conversation keeps its decisions in metadata.json ``approvals``
(:class:`~contemplation.models.ApprovalDecision`): what was decided (``once``, ``always``,
``reject``), about which lookup (the tool and its arguments: the pattern an ``always`` lets
through), by whom (the person on which face, or the agent) and when. :func:`page` lists them
over every active conversation (or one), newest first, a bounded page at a time with a cursor
for the next; :func:`revoke` takes an ``always`` back: it is kept, marked revoked (by whom,
when), and lets nothing through from then on, so the next such lookup is asked again. A
revocation is written under the faces' lock (the same one a decision takes), so it never
loses a decision made meanwhile; a ``once`` or ``reject`` is about one lookup already
answered and is not revocable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contemplation.base.terminal import safe
from contemplation.errors import ContemplationError, InputRejected, NotFound
from contemplation.protocol import logformat
from contemplation.store import plain
from contemplation.store.layout import Conv, Home, list_conversations, read_json
from contemplation.values import APPROVALS_KEY, Decider, decider, grants

if TYPE_CHECKING:  # the settings model is built only by the commands that change
    from contemplation.settings import Settings

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_CONVERSATIONS = 10_000  # conversations looked at by one listing (the newest first)
SHOWN_ID = 12  # characters of a lookup id shown (any unique prefix of 4 or more names it)


@dataclass(frozen=True, slots=True)
class Listed:
    conv: str
    decision: dict[str, Any]  # an ApprovalDecision as the model dumps it (store.plain)

    @property
    def key(self) -> str:
        """Where it sorts (newest first) and what a cursor holds."""
        return f"{self.decision['time']}|{self.conv}|{self.decision['request']}"

    @property
    def grants(self) -> bool:
        return grants(self.decision["decision"], self.decision["revoked"])

    def as_dict(self) -> dict[str, Any]:
        d = self.decision
        out: dict[str, Any] = {
            "id": d["request"],
            "conversation": self.conv,
            "decision": d["decision"],
            "standing": self.grants,
            "tool": d["tool"],
            "arguments": d["arguments"],
            "rule": d["rule"],
            "need": d["need"],
            "by": decider(d["face"], d["agent"]),
            "face": d["face"],
            "time": d["time"],
        }
        if d["revoked"]:
            out |= {
                "revoked": d["revoked"],
                "revoked_by": decider(d["revoked_by"], d["revoked_agent"]),
            }
        elif self.grants:
            out["revoke"] = f"contemplation approvals revoke {d['request'][:SHOWN_ID]}"
        return out


def _convs(home: Home, only: Conv | None) -> list[Conv]:
    if only is not None:
        return [only]
    return list(reversed(list_conversations(home)))[:MAX_CONVERSATIONS]


def every(home: Home, only: Conv | None = None) -> list[Listed]:
    """Every decision kept, newest first (each conversation keeps a bounded number)."""
    out: list[Listed] = []
    for conv in _convs(home, only):
        meta = plain.metadata(conv)
        if meta is not None:
            out.extend(Listed(conv.id, d) for d in plain.approvals(meta))
    out.sort(key=lambda x: x.key, reverse=True)
    return out


def page(
    home: Home,
    *,
    only: Conv | None = None,
    cursor: str | None = None,
    limit: int = DEFAULT_LIMIT,
    standing: bool = False,
) -> dict[str, Any]:
    """``{"decisions": [...], "cursor": next page's cursor or None, "total": n}``: at most
    ``limit`` (at most MAX_LIMIT) decisions, newest first, older than ``cursor``;
    ``standing``: only the ``always`` ones still in force."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InputRejected(f"limit must be 1 to {MAX_LIMIT}, not {limit}")
    found = [x for x in every(home, only) if x.grants or not standing]
    older = [x for x in found if cursor is None or x.key < cursor]
    shown = older[:limit]
    more = len(older) > limit
    return {
        "decisions": [x.as_dict() for x in shown],
        "cursor": shown[-1].key if more and shown else None,
        "total": len(found),
    }


def line(d: dict[str, Any]) -> str:
    """One decision as ``approvals`` and ``status`` print it."""
    args = json.dumps(d["arguments"], ensure_ascii=False)
    what = {"once": "once", "always": "ALWAYS", "reject": "reject"}[d["decision"]]
    out = (
        f"{d['id'][:SHOWN_ID]}  {d['conversation']}  {what}  {d['tool']} {args}"
        f"  by {d['by']} at {d['time'] or '?'}"
    )
    if "revoked" in d:
        out += f"  (revoked by {d['revoked_by']} at {d['revoked']})"
    elif d.get("standing"):
        out += "  (standing; revocable)"
    return safe(out)


def _named(found: list[Listed], ref: str) -> Listed:
    from contemplation.store import waiting

    ref = ref.strip()
    hits = [x for x in found if x.decision["request"] == ref]
    if not hits and len(ref) >= waiting.MIN_PREFIX:
        hits = [x for x in found if x.decision["request"].startswith(ref)]
    if not hits:
        raise NotFound(f"no decision {ref!r}; `contemplation approvals` lists them")
    always = [x for x in hits if x.decision["decision"] == "always"]
    if len({(x.conv, x.decision["request"]) for x in always or hits}) > 1:
        where = "; ".join(f"{x.decision['request']} in {x.conv}" for x in always or hits)
        raise InputRejected(safe(f"{ref!r} names several decisions; use the full id — {where}"))
    if not always:
        d = hits[0].decision
        raise InputRejected(
            safe(
                f"decision {d['request']} ({d['need']}) is {waiting.VERBS[d['decision']]}: "
                "only an 'always' stands, and only it can be revoked"
            )
        )
    return always[0]


def revoke(
    settings: Settings,
    ref: str,
    *,
    only: Conv | None = None,
    face: Decider = "cli",
    agent: str = "",
) -> dict[str, Any]:
    """Take back the ``always`` ``ref`` names (its lookup id or a unique prefix, over every
    active conversation or ``only``): recorded as revoked by ``face`` now (``agent``: which
    agent ran the CLI). Revoking one
    already revoked is refused naming who did it and when. Returns the decision as listed."""
    from contemplation.models import read_approvals
    from contemplation.writer.files import atomic_write_json, faces_lock

    home = Home(settings.home)
    chosen = _named(every(home, only), ref)
    conv = home.conv(chosen.conv)
    with faces_lock(conv):  # the deciders' lock: no decision made meanwhile is lost
        raw = read_json(conv.metadata)
        if raw is None:
            raise ContemplationError(f"{conv.id} has no readable metadata.json")
        given = read_approvals(raw.get(APPROVALS_KEY))
        rid = chosen.decision["request"]
        target = next((d for d in given if d.request == rid and d.decision == "always"), None)
        if target is None:
            raise NotFound(f"decision {rid} is no longer kept in {conv.id}")
        if target.revoked:
            by = decider(target.revoked_by, target.revoked_agent)
            raise InputRejected(
                safe(f"decision {rid} was revoked already by {by} at {target.revoked}")
            )
        target.revoked = logformat.timestamp()
        target.revoked_by = face
        target.revoked_agent = agent
        raw[APPROVALS_KEY] = [d.model_dump(mode="json") for d in given]
        atomic_write_json(conv.metadata, raw, durable=settings.durability == "fsync")
    return Listed(conv.id, target.model_dump()).as_dict()


STATUS_SHOWN = 10  # decisions ``status CONV`` shows (the newest); ``approvals -c`` has the rest


def for_status(home: Home, conv: Conv) -> tuple[list[dict[str, Any]], list[str]]:
    """The newest decisions of ``conv`` (as data) and the lines ``status CONV`` prints."""
    got = page(home, only=conv, limit=STATUS_SHOWN)
    if not got["decisions"]:
        return [], []
    more = f", {got['total']} in all" if got["cursor"] else ""
    lines = [f"decisions (contemplation approvals -c {conv.id}{more}):"]
    lines += ["  " + line(d) for d in got["decisions"]]
    return got["decisions"], lines
