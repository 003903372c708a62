"""Full-text search over every conversation, active and archived, with a derived SQLite index.

The index (:mod:`contemplation.index.db`) is brought up to date before each search, so a
conversation made or edited by hand is found without a restart.

Blocks are indexed with their text (headers and framing left out, as the parser gives it) and
their thinking in a column of its own, searched only when asked. Ranking is FTS5's bm25,
newest activity first on ties. The query is parsed (:mod:`contemplation.index.query`): its
words are always text, never a column filter; a query FTS5 rejects is tried again as a phrase.

Every search is bounded (:class:`Bound`): the query is interrupted past ``search_seconds``
(or when its caller cancels it), and the snippets are made by :mod:`contemplation.index.snippets`
from a bounded stretch of each block, so no block's size or number of matches holds it up.
A cut search keeps the best hits found in time and says so in one line (:attr:`Found.cut`).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contemplation.errors import InputRejected
from contemplation.index import db, snippets
from contemplation.index.listing import Query
from contemplation.index.query import MIN_PREFIX, OPERATORS, Parsed, parse
from contemplation.protocol.logformat import TIME_FORMAT
from contemplation.store import logstream
from contemplation.store.layout import Home

MAX_LIMIT = 200
SEARCH_SECONDS = 10.0  # the default bound of one search (settings: search_seconds)
PROGRESS_STEPS = 200  # SQLite's steps between two looks at the bound (well under 1 ms)
MAX_COUNTED = 1000  # archived blocks counted for a search that left them out


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
    indexed: tuple[int, int] | None = None  # a block past the bound: (its first bytes, of)
    relevance: str = ""  # by meaning: close, near or far (:mod:`contemplation.index.relevance`)
    score: float | None = None  # by meaning: the model's cosine

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
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
        if self.indexed is not None:
            out["indexed_bytes"], out["block_bytes"] = self.indexed
        if self.relevance:
            out["relevance"] = self.relevance
        if self.score is not None:
            out["score"] = round(self.score, 3)
        return out


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
    for form in (TIME_FORMAT, "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, form).strftime(TIME_FORMAT)
    raise InputRejected(f"not a day or a moment: {text!r} (write YYYY-MM-DD or YYYY-MM-DD HH:MM)")


_PLAIN = re.compile(r"[^\W_]+(?:\s+[^\W_]+)*", re.UNICODE)


def as_typed(query: str) -> str:
    """A search box's query as typed: plain words each match as a prefix ("quok" finds
    "quokkas" while it is typed), a word shorter than a prefix may be as itself; anything else
    is the search syntax (:mod:`contemplation.index.query`) and passes through."""
    q = query.strip()
    if _PLAIN.fullmatch(q) and not (OPERATORS & set(q.split())):
        return " ".join(w + "*" if len(w) >= MIN_PREFIX else w for w in q.split())
    return q


class Bound:
    """How long a search may run: until ``seconds`` have passed or ``cancel`` is set (the
    dashboard's client went away, the server stops). Asked by SQLite every few hundred steps
    of the query (a progress handler: a true answer interrupts it) and between snippets."""

    def __init__(self, seconds: float, cancel: threading.Event | None = None) -> None:
        self.seconds = seconds
        self.cancel = cancel
        self.started = time.monotonic()
        self.until = self.started + seconds

    def over(self) -> bool:
        return time.monotonic() >= self.until or (self.cancel is not None and self.cancel.is_set())

    def why(self, found: int) -> str:
        """The line a cut search says (with ``found`` hits kept, the best ones)."""
        if self.cancel is not None and self.cancel.is_set():
            return "search cancelled"
        kept = f"the {found} best hit(s) found in time" if found else "no hit found in time"
        return (
            f"search cut after {self.seconds:g} s: {kept}; narrow it (more words, a longer "
            "prefix, --since, --model) or raise search_seconds"
        )


@dataclass(frozen=True, slots=True)
class Found:
    """A search's hits, best first, and ``cut``: why there may be more ("": there are not)."""

    hits: list[Hit]
    cut: str = ""
    archived: int = 0  # no hit, archived conversations left out: their blocks that match
    partial: int = 0  # blocks searched only by their first bytes (past the reader's bound)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hits": [h.as_dict() for h in self.hits], "count": len(self.hits)}
        if self.cut:
            out["cut"] = self.cut
        if self.archived:
            out["archived_matches"] = self.archived
        if self.partial:
            out["partly_indexed"] = self.partial_line()
        return out

    def partial_line(self) -> str:
        """What a search says when some blocks it covers are indexed in part ("": none)."""
        if not self.partial:
            return ""
        bound = logstream.MAX_BLOCK_BYTES
        said = f"{bound >> 20} MiB" if bound % (1 << 20) == 0 else f"{bound:,} bytes"
        return (
            f"{self.partial} block(s) searched are longer than the index's bound of {said} a "
            "block and indexed by their first bytes only: words past that are not found"
        )

    def archived_line(self) -> str:
        """What a search with no hit says when archived blocks match ("": none do)."""
        if not self.archived:
            return ""
        many = f"{MAX_COUNTED} or more" if self.archived >= MAX_COUNTED else str(self.archived)
        return f"{many} archived block(s) match"


def search(home: Home, query: str, filters: Filters | None = None, limit: int = 20) -> list[Hit]:
    """:func:`find`'s hits, within the default bound."""
    return find(home, query, filters, limit).hits


def find(
    home: Home,
    query: str,
    filters: Filters | None = None,
    limit: int = 20,
    *,
    seconds: float = SEARCH_SECONDS,
    cancel: threading.Event | None = None,
) -> Found:
    """The blocks that match ``query``, best first (bm25), newest conversation first on ties,
    within ``seconds`` (or until ``cancel``): past that, the best hits found so far and the
    line that says it was cut. The query is :mod:`contemplation.index.query`'s (refused in
    one line: too long, a prefix too short); a query FTS5 rejects is searched as a phrase of
    its words. The index is brought up to date first, outside the bound."""
    parsed = parse(query)
    f = filters or Filters()
    limit = min(max(int(limit), 1), MAX_LIMIT)

    def run(conn: sqlite3.Connection) -> Found:
        bound = Bound(seconds, cancel)
        conn.set_progress_handler(bound.over, PROGRESS_STEPS)
        try:
            return _bounded(conn, parsed, f, limit, bound)
        finally:
            conn.set_progress_handler(None, 0)

    return db.read(home, run)


def _bounded(
    conn: sqlite3.Connection, parsed: Parsed, f: Filters, limit: int, bound: Bound
) -> Found:
    """The ranked blocks (the query, interrupted past the bound), then a snippet of each
    while time is left."""
    if bound.over():
        return Found([], bound.why(0))
    try:
        try:
            rows = _ranked(conn, parsed.expression, f, limit)
        except sqlite3.OperationalError as exc:
            if bound.over() or "locked" in str(exc):
                raise
            try:  # the words as said
                rows = _ranked(conn, parsed.as_phrase, f, limit)
            except sqlite3.OperationalError as again:
                if bound.over():
                    raise
                raise InputRejected(f"cannot search for that: {again}") from None
    except sqlite3.OperationalError:
        if bound.over():  # interrupted by the bound: never an error of the index
            return Found([], bound.why(0))
        raise
    marks = snippets.Marks(parsed.pattern(), parsed.needles())
    columns = ("zbody", "zthinking") if f.thinking else ("zbody",)
    hits: list[Hit] = []
    for r in rows:
        if bound.over():
            return Found(hits, bound.why(len(hits)))
        snip = snippets.of_block(conn, r[0], marks, bound.over, columns)
        part = (int(r[10]), int(r[9])) if r[9] is not None else None
        hits.append(Hit(r[1], r[2], bool(r[3]), r[4], r[5], r[6], r[7], snip, r[8], part))
    partial = _partial(conn, f)
    if hits or f.archived or f.status == "archived":
        return Found(hits, partial=partial)
    try:  # nothing active: say how many archived blocks would have matched
        return Found(hits, archived=_archived_count(conn, parsed, f), partial=partial)
    except sqlite3.OperationalError:
        if bound.over():
            return Found(hits, partial=partial)  # no count in time: the search was not cut
        raise


def _partial(conn: sqlite3.Connection, f: Filters) -> int:
    """The blocks in the search's conversations indexed by their first bytes only."""
    archived = f.status == "archived"
    scope = "archived" if archived else "all" if f.archived else "active"
    where = {"archived": "c.archived = 1", "all": "1", "active": "c.archived = 0"}[scope]
    try:
        got = conn.execute(
            f"SELECT count(*) FROM cut JOIN convs c ON c.id = cut.conv WHERE {where}"
        ).fetchone()
    except sqlite3.OperationalError:  # interrupted past the bound: not said
        return 0
    return int(got[0])


def _archived_count(conn: sqlite3.Connection, parsed: Parsed, f: Filters) -> int:
    """The blocks of archived conversations that match (at most :data:`MAX_COUNTED`)."""
    of_convs = Query(scope="archived", status=f.status, model=f.model)
    try:
        return _matching(conn, parsed.expression, f, of_convs)
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise
        return _matching(conn, parsed.as_phrase, f, of_convs)


def _matching(conn: sqlite3.Connection, query: str, f: Filters, of_convs: Query) -> int:
    where, args = _where(query, f, of_convs)
    return int(
        conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM text JOIN blocks b ON b.id = text.rowid "
            f"JOIN convs c ON c.id = b.conv WHERE {' AND '.join(where)} LIMIT ?)",
            (*args, MAX_COUNTED),
        ).fetchone()[0]
    )


def _where(query: str, f: Filters, of_convs: Query) -> tuple[list[str], list[Any]]:
    """The WHERE clauses of a search of ``of_convs`` for ``query``."""
    columns = "{body thinking}" if f.thinking else "{body}"
    where, args = of_convs.clauses("c.")
    where.insert(0, "text MATCH ?")
    args.insert(0, f"{columns} : ({query})")
    if f.since:
        where.append("b.time >= ?")
        args.append(f.since)
    return where, args


def _ranked(conn: sqlite3.Connection, query: str, f: Filters, limit: int) -> list[Any]:
    """The best ``limit`` blocks' ids and where they are (no snippet: FTS5's takes time that
    grows with the square of a block's matches, 12 s for 160 KB of one word, and cannot be
    interrupted)."""
    archived = f.status == "archived"
    scope = "archived" if archived else "all" if f.archived else "active"
    of_convs = Query(scope=scope, status="" if archived else f.status, model=f.model)
    where, args = _where(query, f, of_convs)
    return conn.execute(
        "SELECT b.id, b.conv, c.topic, c.archived, c.status, b.block, b.sender, b.time, b.at, "
        "(SELECT bytes FROM cut WHERE cut.conv = b.conv AND cut.at = b.at), "
        "(SELECT kept FROM cut WHERE cut.conv = b.conv AND cut.at = b.at) "
        "FROM text JOIN blocks b ON b.id = text.rowid JOIN convs c ON c.id = b.conv "
        f"WHERE {' AND '.join(where)} "
        "ORDER BY bm25(text), c.last_ts DESC LIMIT ?",
        (*args, limit),
    ).fetchall()
