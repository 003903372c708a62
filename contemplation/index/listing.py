"""Conversations listed from the index, newest activity first, a page at a time.

Every face lists through here (``list``, ``status``, MCP ``conversation_list``, the
dashboard): the index is brought up to date (two ``stat`` calls a folder) and the rows are
read with the filters and the page applied in SQL, so a home with 10,000 archived
conversations costs a page, not a walk through every folder's JSON. The cursor is a keyset
(activity, id): rows that change between pages are neither repeated nor skipped.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from contemplation.index import db
from contemplation.protocol import paging
from contemplation.store.layout import Home


@dataclass(frozen=True, slots=True)
class Query:
    """Which conversations. ``scope``: active, archived or all; ``status``: one status;
    ``model``: "name" or "backend/name"; ``words``: each in the id, topic, model or status;
    ``topic``: each of its words in the topic."""

    scope: str = "active"
    status: str = ""
    model: str = ""
    words: str = ""
    topic: str = ""

    def clauses(self, table: str = "") -> tuple[list[str], list[Any]]:
        """SQL conditions on the ``convs`` table (``table``: its alias in a join, "c.")."""
        t = table
        clauses: list[str] = []
        args: list[Any] = []
        if self.scope == "active":
            clauses.append(f"{t}archived = 0")
        elif self.scope == "archived":
            clauses.append(f"{t}archived = 1")
        if self.status:
            clauses.append(f"{t}status = ?")
            args.append(self.status)
        if self.model:
            clauses.append(f"({t}model = ? OR {t}backend || '/' || {t}model = ?)")
            args += [self.model, self.model]
        for column, text in (("hay", self.words), ("topic_key", self.topic)):
            for word in text.casefold().split():
                clauses.append(f"instr({t}{column}, ?) > 0")
                args.append(word)
        return clauses, args

    def where(self) -> tuple[str, list[Any]]:
        clauses, args = self.clauses()
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


@dataclass(slots=True)
class Page:
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0  # how many match, over every page
    cursor: str | None = None  # the next page's; None: this is the last

    def as_dict(self, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The one shape of a page on every face (``list --json``, MCP ``conversation_list``):
        its rows (``rows``: as that face shows them), how many, how many match in all,
        whether more follow and, while they do, the cursor of the next page."""
        shown = self.rows if rows is None else rows
        out: dict[str, Any] = {
            "conversations": shown,
            "count": len(shown),
            "total": self.total,
            "more": self.cursor is not None,
        }
        if self.cursor is not None:
            out["cursor"] = self.cursor
        return out


ORDER = " ORDER BY last_ts DESC, id DESC"


def page(home: Home, q: Query, limit: int | None = None, cursor: str | None = None) -> Page:
    """One page of summaries after ``cursor`` (``limit`` None: every row)."""

    def run(conn: sqlite3.Connection) -> Page:
        where, args = q.where()
        total = conn.execute(f"SELECT count(*) FROM convs{where}", args).fetchone()[0]
        if cursor:
            ts, conv_id = paging.decode_cursor(cursor)
            joiner = " AND " if where else " WHERE "
            where += joiner + "(last_ts < ? OR (last_ts = ? AND id < ?))"
            args = [*args, ts, ts, conv_id]
        sql = f"SELECT row FROM convs{where}{ORDER}"
        if limit is not None:
            sql += f" LIMIT {int(limit) + 1}"
        rows = [json.loads(r[0]) for r in conn.execute(sql, args)]
        out = Page(rows, total)
        if limit is not None and len(rows) > limit:
            del rows[limit:]
            out.cursor = paging.encode_cursor(rows[-1]["last_activity_ts"], rows[-1]["id"])
        return out

    return db.read(home, run)


def summaries(home: Home, *, include_completed: bool = True) -> list[dict[str, Any]]:
    """Every summary, newest activity first."""
    return page(home, Query(scope="all" if include_completed else "active")).rows


def one(home: Home, conv_id: str) -> dict[str, Any] | None:
    """One conversation's summary, its folder read again first if it changed."""

    def run(conn: sqlite3.Connection) -> dict[str, Any] | None:
        got = conn.execute("SELECT row FROM convs WHERE id = ?", (conv_id,)).fetchone()
        return json.loads(got[0]) if got else None

    return db.read(home, run, only=[conv_id])


def stats(home: Home) -> dict[str, Any]:
    """The dashboard's figures, counted in SQL: conversations by status, turns over all of
    them, and the bytes ``active/`` and ``completed/`` hold."""

    def run(conn: sqlite3.Connection) -> dict[str, Any]:
        by_status = dict(conn.execute("SELECT status, count(*) FROM convs GROUP BY status"))
        turns = conn.execute(
            "SELECT coalesce(sum(json_extract(row, '$.turns')), 0) FROM convs"
        ).fetchone()[0]
        return {"by_status": by_status, "turns_total": int(turns)}

    return counts(home) | db.read(home, run)


def counts(home: Home) -> dict[str, int]:
    """How many conversations are active and archived, and the bytes each place holds."""

    def run(conn: sqlite3.Connection) -> dict[str, int]:
        got = dict.fromkeys(("active", "completed", "active_bytes", "completed_bytes"), 0)
        for archived, n, size in conn.execute(
            "SELECT archived, count(*), coalesce(sum(disk), 0) FROM convs GROUP BY archived"
        ):
            where = "completed" if archived else "active"
            got[where], got[f"{where}_bytes"] = n, size
        return got

    return db.read(home, run)
