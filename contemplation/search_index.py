"""Full-text search over every conversation, active and archived, with a derived SQLite index.

The index (:mod:`contemplation.index_db`) is brought up to date before each search, so a
conversation made or edited by hand is found without a restart.

Blocks are indexed with their text (headers and framing left out, as the parser gives it) and
their thinking in a column of its own, searched only when asked. Ranking is FTS5's bm25,
newest activity first on ties. FTS5 query syntax passes through; a query it rejects is tried
again as a phrase.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contemplation import index_db, index_rows
from contemplation.errors import InputRejected
from contemplation.layout import Home
from contemplation.listing import Query

MAX_LIMIT = 200


@dataclass(frozen=True, slots=True)
class Hit:
    conv: str
    topic: str
    archived: bool
    status: str
    block: int  # 1-based, over the whole conversation
    sender: str
    time: str
    snippet: str  # the match marked «…»
    at: int  # the block's offset in the whole conversation (a cursor for check/wait)

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conv,
            "topic": self.topic,
            "archived": self.archived,
            "status": self.status,
            "block": self.block,
            "from": self.sender,
            "time": self.time,
            "snippet": self.snippet,
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class Filters:
    """What narrows a search besides its words."""

    archived: bool = False  # archived conversations too
    thinking: bool = False  # the models' thinking too
    model: str = ""  # "name" or "backend/name"
    status: str = ""  # a conversation status, or "archived"
    since: str = ""  # blocks from this day or moment on ("2026-11-01", "2026-11-01 09:00")


def since_bound(text: str) -> str:
    """A ``--since`` value as the headers' own form (they compare as strings)."""
    text = text.strip().replace("T", " ")
    if not text:
        return ""
    for form in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, form).strftime(index_rows.HEADER_TIME)
    raise InputRejected(f"not a day or a moment: {text!r} (write YYYY-MM-DD or YYYY-MM-DD HH:MM)")


_PLAIN = re.compile(r"[^\W_]+(?:\s+[^\W_]+)*", re.UNICODE)


def as_typed(query: str) -> str:
    """A search box's query as typed: plain words each match as a prefix ("quok" finds
    "quokkas" while it is typed); anything else is FTS5 syntax and passes through."""
    q = query.strip()
    if _PLAIN.fullmatch(q) and not ({"AND", "OR", "NOT", "NEAR"} & set(q.split())):
        return " ".join(w + "*" for w in q.split())
    return q


def search(home: Home, query: str, filters: Filters | None = None, limit: int = 20) -> list[Hit]:
    """The blocks that match ``query``, best first (bm25), newest conversation first on ties.
    FTS5 syntax passes through; a query FTS5 rejects is searched as a phrase of its words."""
    if not query.strip():
        raise InputRejected("the search needs a query")
    f = filters or Filters()
    limit = min(max(int(limit), 1), MAX_LIMIT)

    def run(conn: sqlite3.Connection) -> list[Hit]:
        try:
            return _run(conn, query, f, limit)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise
            phrase = '"' + query.replace('"', '""') + '"'  # not FTS5 syntax: the words as said
            try:
                return _run(conn, phrase, f, limit)
            except sqlite3.OperationalError as again:
                raise InputRejected(f"cannot search for {query!r}: {again}") from None

    return index_db.read(home, run)


def _run(conn: sqlite3.Connection, query: str, f: Filters, limit: int) -> list[Hit]:
    columns = "{body thinking}" if f.thinking else "{body}"
    archived = f.status == "archived"
    scope = "archived" if archived else "all" if f.archived else "active"
    of_convs = Query(scope=scope, status="" if archived else f.status, model=f.model)
    where, args = of_convs.clauses("c.")
    where.insert(0, "text MATCH ?")
    args.insert(0, f"{columns} : ({query})")
    if f.since:
        where.append("b.time >= ?")
        args.append(f.since)
    rows = conn.execute(
        "SELECT b.conv, c.topic, c.archived, c.status, b.block, b.sender, b.time, "
        "snippet(text, -1, '«', '»', '…', 16), b.at "  # about 16 words around the match
        "FROM text JOIN blocks b ON b.id = text.rowid JOIN convs c ON c.id = b.conv "
        f"WHERE {' AND '.join(where)} "
        "ORDER BY bm25(text), c.last_ts DESC LIMIT ?",
        (*args, limit),
    ).fetchall()
    return [Hit(r[0], r[1], bool(r[2]), r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows]
