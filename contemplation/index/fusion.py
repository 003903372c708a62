"""Search by words, by meaning or both (reciprocal rank fusion), and the conversations
related to one: what every face calls (CLI ``search``/``related``, MCP ``conversation_search``
/``conversation_related``, the dashboard's search).

``words`` is :mod:`contemplation.index.search` (blocks ranked by bm25). ``meaning`` ranks
conversations by their best vector (:mod:`contemplation.index.semantic`), cut where the
scores stop standing out of the query's own (:mod:`contemplation.index.relevance`: no fixed
floor); when even the best is far, the nearest are listed and the page says so (``weak``).
``both`` fuses the two rankings by conversation (``1/(K + rank)`` summed), those found both
ways first, the words' hit shown where it has one. Without the semantic extra
the default is words, and the page says in one line how to get meaning too. Every page is
at most ``limit`` hits with an opaque cursor for the next (``next``; "" at the end) from a
ranking :data:`DEPTH` deep.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from contemplation.errors import InputRejected
from contemplation.index import db, embedder, relevance, served
from contemplation.index.listing import Query
from contemplation.index.search import MAX_LIMIT, SEARCH_SECONDS, Filters, Found, Hit, find
from contemplation.store.layout import Home

if TYPE_CHECKING:  # numpy's, with the extra: imported where meaning is asked for
    from contemplation.index import semantic

MODES = ("words", "meaning", "both")
K = 60  # reciprocal rank fusion's constant (Cormack et al.)
SNIPPET_CHARS = 200
DEPTH = 200  # the deepest a ranking goes: pages come from it
WEAK_LINE = "nothing close by meaning: the hits are the nearest, farther ones after"
NO_MEANING = f"words only; to search by meaning too: {embedder.INSTALL}"
DOWN_LINE = "ranked by words only until it answers ([semantic] embed_url)"


@dataclass(frozen=True, slots=True)
class Page:
    hits: list[Hit]
    mode: str
    next: str = ""  # the cursor of the next page ("": none)
    note: str = ""  # how to get meaning too, when it is not installed
    found: Found = field(default_factory=lambda: Found([]))  # the words' (cut, archived...)
    unembedded: int = 0  # conversations without current vectors (meaning may miss them)
    weak: bool = False  # by meaning, nothing is close: the hits are the nearest

    def as_dict(self) -> dict[str, Any]:
        out = self.found.as_dict() | {
            "hits": [h.as_dict() for h in self.hits],
            "count": len(self.hits),
            "mode": self.mode,
        }
        if self.next:
            out["next"] = self.next
        if self.note:
            out["note"] = self.note
        if self.unembedded:
            out["not_embedded"] = self.unembedded_line()
        if self.weak:
            out["nothing_close"] = WEAK_LINE
        return out

    def unembedded_line(self) -> str:
        """What a search by meaning says when some conversations have no vectors yet."""
        if not self.unembedded:
            return ""
        return (
            f"{self.unembedded} conversation(s) not embedded yet, which meaning may miss: the "
            "daemon embeds them in the background (or: contemplation reindex)"
        )


def mode_of(mode: str) -> tuple[str, str]:
    """The mode asked ("" or "auto": both when the extra is installed) and its note."""
    m = (mode or "auto").strip().lower()
    if m == "auto":
        return ("both", "") if embedder.available() else ("words", NO_MEANING)
    if m not in MODES:
        raise InputRejected(f"unknown search mode {mode!r}: words, meaning or both")
    if m != "words":
        embedder.require()
    return m, ""


def offset_of(cursor: str | None) -> int:
    if not cursor:
        return 0
    if not re.fullmatch(r"\d{1,4}", cursor.strip()) or int(cursor) >= DEPTH:
        raise InputRejected(f"not a cursor of this search: {cursor!r} (pass back its 'next')")
    return int(cursor)


def _paged(hits: list[Hit], offset: int, limit: int, depth: int) -> tuple[list[Hit], str]:
    page = hits[offset : offset + limit]
    more = len(hits) > offset + limit and offset + limit < depth
    return page, str(offset + limit) if more else ""


def search(
    home: Home,
    query: str,
    filters: Filters | None = None,
    limit: int = 20,
    *,
    mode: str = "",
    cursor: str | None = None,
    words: str = "",
    seconds: float = SEARCH_SECONDS,
    cancel: threading.Event | None = None,
) -> Page:
    """One page of ``query``'s hits in ``mode`` (words, meaning, both; "" the best there is);
    ``words``: the query's form for the words' search when it differs (a search box's
    prefixes)."""
    f = filters or Filters()
    m, note = mode_of(mode)
    limit = min(max(int(limit), 1), MAX_LIMIT)
    offset = offset_of(cursor)
    depth = min(MAX_LIMIT, offset + limit + 1)
    if m == "words":
        found = find(home, words or query, f, depth, seconds=seconds, cancel=cancel)
        hits, nxt = _paged(found.hits, offset, limit, MAX_LIMIT)
        return Page(hits, m, nxt, note, found)

    # one model for the query and the vectors it is compared with, whatever changes meanwhile
    who = embedder.current()
    model = embedder.tag(who)
    soon = embedder.query_soon(query, who)  # on the model's thread while the words are searched
    found = Found([])
    if m == "both":
        deep = min(MAX_LIMIT, offset + 2 * limit + 20)  # the words' ranking a little past
        found = find(home, words or query, f, deep, seconds=seconds, cancel=cancel)
    try:
        qvec = soon.result()
    except served.Unreachable as exc:  # the person's server is down: said, and words
        if m == "meaning":
            found = find(home, words or query, f, depth, seconds=seconds, cancel=cancel)
        hits, nxt = _paged(found.hits, offset, limit, MAX_LIMIT)
        return Page(hits, "words", nxt, f"{exc}; {DOWN_LINE}", found)

    def paged(conn: sqlite3.Connection) -> tuple[list[Hit], str, int, bool]:
        from contemplation.index import semantic

        near, cal, weak = _near(conn, qvec, f, model)
        ranked: list[Hit | semantic.Near] = (
            [*near] if m == "meaning" else _fuse(found.hits, near, cal, weak)
        )
        page = ranked[offset : offset + limit]
        more = len(ranked) > offset + limit and offset + limit < DEPTH
        hits = [h if isinstance(h, Hit) else _hit(conn, h, cal) for h in page]
        nxt = str(offset + limit) if more else ""
        shown = [h for h in hits if h is not None]
        # weak: nothing by meaning is close and no word matches either
        weak = weak and not found.hits
        return shown, nxt, semantic.pending_count(conn, model), weak

    # the index was just brought up to date (by the words' search, or here for meaning alone)
    hits, nxt, unembedded, weak = db.read(home, paged, only=() if m == "both" else None)
    return Page(hits, m, nxt, note, replace(found, hits=[]), unembedded, weak)


def _fuse(
    words: list[Hit],
    meaning: list[semantic.Near],
    cal: relevance.Calibration,
    weak: bool,
) -> list[Hit | semantic.Near]:
    """Conversations found both ways first (by words, and by meaning within the cut), then
    those found one way, then the nearest by meaning when none is close (``weak``); in each,
    by the sum of ``1/(K + rank)`` over both rankings (each ranks a conversation at its best
    hit). Each is shown by its blocks that match the words, in bm25 order, or by its best
    vector's block when no word matches."""
    score: dict[str, float] = {}
    shown: dict[str, list[Hit | semantic.Near]] = {}
    by_meaning = {n.conv: n for n in meaning}
    for h in words:
        if h.conv not in score:
            score[h.conv] = 1.0 / (K + len(score) + 1)
        n = by_meaning.get(h.conv)
        said = replace(h, relevance=cal.label(n.score), score=n.score) if n else h
        shown.setdefault(h.conv, []).append(said)
    tier = {c: 1 + (c in by_meaning) for c in score}
    for rank, n in enumerate(meaning, 1):
        score[n.conv] = score.get(n.conv, 0.0) + 1.0 / (K + rank)
        shown.setdefault(n.conv, [n])
        tier.setdefault(n.conv, 0 if weak else 1)
    return [h for c in sorted(score, key=lambda c: (-tier[c], -score[c])) for h in shown[c]]


def _scope(f: Filters) -> Query:
    archived = f.status == "archived"
    scope = "archived" if archived else "all" if f.archived else "active"
    return Query(scope=scope, status="" if archived else f.status, model=f.model)


def _near(
    conn: sqlite3.Connection, qvec: semantic.Matrix, f: Filters, model: str
) -> tuple[list[semantic.Near], relevance.Calibration, bool]:
    """The conversations by meaning: those of the filters' scope (with ``since``: their best
    vector's block from then on), cut where they stop standing out (all of them, ``weak``,
    when none does); the query's calibration."""
    from contemplation.index import semantic

    every = f.archived and not (f.status or f.model)  # no set of ids to look up
    covered = None if every else semantic.covered(conn, _scope(f))
    ranking = semantic.rank(conn, qvec, covered, depth=DEPTH, model=model)
    near = ranking.near
    if f.since:
        near = [n for n in near if _time(conn, n) >= f.since]
    cut = relevance.cut([n.score for n in near], ranking.calibration)
    return near[: cut.keep], ranking.calibration, cut.weak


def _time(conn: sqlite3.Connection, n: semantic.Near) -> str:
    from contemplation.index import semantic

    sql = "SELECT time FROM blocks WHERE conv = ? "
    if n.at == semantic.CONV_AT:
        row = conn.execute(sql + "ORDER BY block LIMIT 1", (n.conv,)).fetchone()
    else:
        row = conn.execute(sql + "AND at = ?", (n.conv, n.at)).fetchone()
    return str(row[0]) if row else ""


def _hit(conn: sqlite3.Connection, n: semantic.Near, cal: relevance.Calibration) -> Hit | None:
    """A conversation found by meaning as a hit: the block its best vector is of (its first
    for the conversation's own), the block's first words for a snippet."""
    from contemplation.index import semantic

    c = conn.execute("SELECT topic, archived, status FROM convs WHERE id = ?", (n.conv,)).fetchone()
    sql = "SELECT block, sender, time, at, unz(zbody) FROM blocks WHERE conv = ? "
    if n.at == semantic.CONV_AT:
        b = conn.execute(sql + "ORDER BY block LIMIT 1", (n.conv,)).fetchone()
    else:
        b = conn.execute(sql + "AND at = ?", (n.conv, n.at)).fetchone()
    if c is None or b is None:
        return None
    text = " ".join(str(b[4] or "").split())
    snippet = text[:SNIPPET_CHARS] + ("…" if len(text) > SNIPPET_CHARS else "")
    return Hit(
        n.conv,
        str(c[0] or ""),
        bool(c[1]),
        str(c[2] or ""),
        int(b[0]),
        str(b[1]),
        str(b[2]),
        snippet,
        int(b[3]),
        relevance=cal.label(n.score),
        score=n.score,
    )


def related(
    home: Home,
    conv_id: str,
    limit: int = 10,
    *,
    cursor: str | None = None,
    archived: bool = True,
) -> Page:
    """The conversations nearest in meaning to ``conv_id`` (archived ones too unless told)."""
    embedder.require()
    from contemplation.index import semantic

    limit = min(max(int(limit), 1), MAX_LIMIT)
    offset = offset_of(cursor)
    who = embedder.current()  # one model for the conversation's vector and the others'

    def run(conn: sqlite3.Connection) -> tuple[list[Hit], str]:
        if conn.execute("SELECT 1 FROM convs WHERE id = ?", (conv_id,)).fetchone() is None:
            raise InputRejected(f"no conversation {conv_id!r}")
        vec = semantic.conv_vector(conn, conv_id, who)
        if vec is None:
            return [], ""
        covered = None if archived else semantic.covered(conn, Query(scope="active"))
        ranking = semantic.rank(  # no query: the questions' term is left out
            conn,
            vec,
            covered,
            exclude=conv_id,
            depth=DEPTH,
            model=embedder.tag(who),
            question=False,
        )
        near = ranking.near
        more = len(near) > offset + limit and offset + limit < DEPTH
        hits = [_hit(conn, n, ranking.calibration) for n in near[offset : offset + limit]]
        return [h for h in hits if h is not None], str(offset + limit) if more else ""

    hits, nxt = db.read(home, run)
    return Page(hits, "meaning", nxt)
