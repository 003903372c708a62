"""The ledger summed over conversations, from the index.

Each conversation's state.json ledger is in the index's ``ledger`` table (a row per
provider/model), so a sum over 10,000 archived conversations is one SQL query over those
rows, never a walk through their folders. Grouped by conversation, model or provider, a page
at a time (keyset cursor on the group's key); the totals are over every matching row.
A figure no turn reported stays None (SQL's sum of NULLs). The escalation ladder's books are
in the ``ladder`` table (a row per rung that answered, one with the rest) and summed the same
way: the turns each rung answered, those escalated and those that reached the agent.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Literal

from contemplation.index import db
from contemplation.protocol import paging
from contemplation.protocol.ledger import FIELDS
from contemplation.store.layout import Home

By = Literal["conversation", "model", "provider"]
BY: tuple[By, ...] = ("conversation", "model", "provider")
_KEY: dict[By, str] = {
    "conversation": "conv",
    "model": "provider || '/' || model",
    "provider": "provider",
}
LIMIT = 50  # groups a page, unless asked for fewer
MAX_LIMIT = 500
_INT = frozenset({"sent", "reused", "recomputed", "output"})


def _sums(row: tuple[Any, ...]) -> dict[str, Any]:
    turns, *figures, context = row
    out: dict[str, Any] = {"turns": int(turns or 0)}
    for name, v in zip(FIELDS, figures, strict=True):
        out[name] = None if v is None else (int(v) if name in _INT else round(float(v), 1))
    out["context_bytes"] = int(context or 0)
    return out


_SELECT = ", ".join(["sum(turns)", *(f"sum({c})" for c in FIELDS), "sum(context_bytes)"])


def summed(
    home: Home,
    *,
    by: By = "conversation",
    scope: str = "all",
    limit: int = LIMIT,
    cursor: str | None = None,
    conv: str | None = None,
    rungs: int = 0,
) -> dict[str, Any]:
    """One page of groups after ``cursor`` and the totals over every group. ``scope``:
    active, archived or all; ``conv``: that conversation's rows only; ``rungs``: with the
    escalation ladder's sums too (:func:`ladder`, that many rungs), from the same read."""
    key = _KEY[by]
    limit = max(1, min(int(limit), MAX_LIMIT))

    def run(c: sqlite3.Connection) -> dict[str, Any]:
        where: list[str] = []
        args: list[Any] = []
        if scope in ("active", "archived"):
            where.append("archived = ?")
            args.append(int(scope == "archived"))
        if conv is not None:
            where.append("conv = ?")
            args.append(conv)
        sql_where = (" WHERE " + " AND ".join(where)) if where else ""
        # the SQL is made of this module's constants; every value is a parameter
        totals = _sums(c.execute(f"SELECT {_SELECT} FROM ledger{sql_where}", args).fetchone())  # noqa: S608
        counted = f"SELECT count(DISTINCT {key}) FROM ledger{sql_where}"  # noqa: S608
        found = c.execute(counted, args).fetchone()[0]
        if cursor:
            _, after = paging.decode_cursor(cursor)
            where.append(f"{key} > ?")
            args.append(after)
        page_where = (" WHERE " + " AND ".join(where)) if where else ""
        sql = f"SELECT {key} AS k, {_SELECT} FROM ledger{page_where} GROUP BY k"  # noqa: S608
        rows = c.execute(f"{sql} ORDER BY k LIMIT {limit + 1}", args).fetchall()
        out: dict[str, Any] = {
            "by": by,
            "total": totals,
            "groups": [{"key": str(r[0]), **_sums(r[1:])} for r in rows[:limit]],
            "count": min(len(rows), limit),
            "found": int(found),
            "more": len(rows) > limit,
        }
        if len(rows) > limit:
            out["cursor"] = paging.encode_cursor(0.0, str(rows[limit - 1][0]))
        if rungs:
            out["ladder"] = _ladder(c, scope, rungs)
        return out

    return db.read(home, run, only=[conv] if conv is not None else None)


RUNGS_SHOWN = 20  # rungs the ladder's sums list, unless asked for fewer or more


def ladder(home: Home, *, scope: str = "all", limit: int = RUNGS_SHOWN) -> dict[str, Any]:
    """The escalation ladder's books summed over every conversation: the conversations with a
    ladder, the turns answered locally (each rung's, the most answered first, ``limit`` of
    them; ``found`` rungs in all, ``more`` when some were left out), the turns escalated,
    those that reached the agent, and the frontier tokens not spent (an estimate)."""
    return db.read(home, lambda c: _ladder(c, scope, limit))


def _ladder(c: sqlite3.Connection, scope: str, limit: int) -> dict[str, Any]:
    limit = max(1, min(int(limit), MAX_LIMIT))
    where, args = "", []
    if scope in ("active", "archived"):
        where, args = " AND archived = ?", [int(scope == "archived")]
    # the SQL is made of this module's constants; every value is a parameter
    sql = (
        "SELECT count(DISTINCT conv), sum(answered), sum(escalated), sum(to_agent), "  # noqa: S608
        f"sum(saved), count(DISTINCT rung) FROM ladder WHERE 1{where}"
    )
    convs, answered, escalated, to_agent, saved, found = c.execute(sql, args).fetchone()
    per = (
        "SELECT rung, sum(answered) AS n, count(DISTINCT conv) FROM ladder "  # noqa: S608
        f"WHERE rung IS NOT NULL{where} GROUP BY rung ORDER BY n DESC, rung LIMIT {limit}"
    )
    rungs = [
        {"rung": str(r), "answered": int(n or 0), "conversations": int(k)}
        for r, n, k in c.execute(per, args).fetchall()
    ]
    return {
        "conversations": int(convs or 0),
        "answered": int(answered or 0),
        "escalated": int(escalated or 0),
        "to_agent": int(to_agent or 0),
        "saved_tokens_estimate": int(saved or 0),
        "rungs": rungs,
        "found": int(found or 0),
        "more": int(found or 0) > len(rungs),
    }
