"""Vectors of meaning over every conversation, kept in the derived index.

Each conversation gets one vector of its topic and first messages (``at`` -1) and each long
block one of its own (``at``: its offset), in the index's ``vectors`` table with the digest of
the text it was made from: a conversation whose log grew keeps the vectors whose text did not
change, and ``reindex`` (which empties the tables) makes them all again. :func:`update` embeds
what is missing, newest conversations first, within a time slice; the daemon's index keeper
calls it off the event loop after each refresh (:mod:`contemplation.daemon.index_keeper`).

Each vector records the model that made it (:func:`embedder.tag`, in its digest and in
``vec_done``'s key; "" for the offline model, as before): after a change of model every
conversation is pending, the keeper makes its vectors anew in its slices, and meanwhile a
search reads only the current model's vectors and says how many conversations it lacks.

A query is compared with every vector at once (brute-force cosine over a numpy matrix, kept
per process while the table is unchanged); a conversation scores its best vector.

A conversation also has its opening question (its first block by the agent) embedded as a
*query* (``at`` :data:`QUESTION_AT`; e5's symmetric use, query against query), never one of
the vectors it scores by: :data:`QUESTION_WEIGHT` of that vector's cosine with the query, less
its own crowd among the other conversations' questions, is added to a search's score. Chosen
on half of the labelled set's queries, the other half held out: the hard third's recall@3 0.89
to 0.92 (held out 0.94 to 1.00), all 100's 0.95 to 0.97, nothing lowered
(bench/bench_semantic_variants.py). The term is centred on its median over the questions, so a
conversation whose question's vector is not made yet (an index made by an older version,
until the keeper makes them) keeps its score without the term, in the middle of the others',
neither first nor last for it. ``related`` (a conversation against the others) leaves it out:
it has no query.

A vector's score is its cosine less a share of its crowd's (:func:`crowds`): the mean cosine of
its nearest vectors of other conversations. A small model's vectors crowd together: a text
much like many others (one of many conversations alike, or a "hub" the model puts near
everything) came first for queries about something else. Taking :data:`CROWD_WEIGHT` of its
crowd from it lifted the labelled set's recall@3 from 0.93 to 0.95, its hard third's from 0.83
to 0.89 (the constants tuned on half of the queries, the other half held out: 0.89 to 0.94),
and among 400 conversations alike the whole set's from 0.76 to 0.90; the crowds cost ~0.1 s of
CPU when 10,000 vectors are read, nothing a query (docs/internals/benchmarks.md).

The crowds are kept in the index (:func:`keep_crowds`, on the indexer's path: after each slice
of :func:`embed_pending`), so a search in a new process (each CLI call) reads them instead of
computing them. Kept crowds are used only while the vectors they come from are unchanged:
triggers on the ``vectors`` table count every write to it (by any version) in ``vec_gen``, and
kept crowds name the count they were computed at; a vectors table made anew has no triggers,
and its kept crowds are never read. An index without them (made by an older version) is
ranked as before, its crowds computed when its vectors are read.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contemplation.errors import InputRejected
from contemplation.index import db, embedder, pending, relevance, served
from contemplation.index.listing import Query
from contemplation.store.layout import Home

CONV_AT = -1  # the conversation's own vector: topic and first messages
FIRST_BLOCKS = 3  # the first messages that make a conversation's vector
LONG_Z = 600  # a block this long compressed (about 1,500 characters) gets a vector ...
MAX_LONG = 8  # ... at most this many a conversation
UPDATE_SECONDS = 5.0  # the keeper's slice: it comes back for the rest
CROWD_K = 10  # a vector's crowd: its nearest vectors of other conversations, this many ...
CROWD_SAME = 0.98  # ... none a copy of it (a fork's first messages are its parent's) ...
CROWD_REFS = 256  # ... among this many at most, evenly spread (linear: ~90 ms CPU at 10,000)
CROWD_WEIGHT = 0.25  # its score is its cosine less this share of its crowd's mean cosine
QUESTION_AT = -2  # the conversation's opening question, embedded as a query
QUESTION_WEIGHT = 0.25  # a search adds this share of the question's score (less its crowd)
# what kept crowds were computed by (rows in rowid order, each kind's crowd among its kind:
# the questions among the questions): another rule computes them anew
CROWD_RULE = f"k{CROWD_K} same{CROWD_SAME} refs{CROWD_REFS} rowid kinds"
_TRIGGERS = ("vectors_gen_insert", "vectors_gen_delete", "vectors_gen_update")

Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Near:
    """A conversation by meaning: its best vector's score and block offset (-1: as a whole)."""

    conv: str
    score: float
    at: int


def _digest(text: str) -> str:
    """The text's digest, with the model's tag before it (none for the offline model)."""
    plain = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
    model = embedder.tag()
    return f"{model}|{plain}" if model else plain


def _key_tail(model: str | None = None) -> str:
    """What ends a conversation's ``vec_done`` key: its model ("" for the offline one; None:
    the current one)."""
    return pending.key_tail(embedder.tag() if model is None else model)


def _mine(model: str | None = None) -> tuple[str, tuple[str, ...]]:
    """The SQL that keeps the vectors of ``model`` (None: the current one), and its
    arguments."""
    model = embedder.tag() if model is None else model
    if not model:
        return "instr(digest, '|') = 0", ()
    return "substr(digest, 1, ?) = ?", (str(len(model) + 1), f"{model}|")


def texts_of(conn: sqlite3.Connection, conv_id: str, topic: str) -> dict[int, str]:
    """What one conversation's vectors are made from, by ``at``: its topic and first blocks,
    and its first long blocks (compressed to ``LONG_Z`` bytes or more), each cut to the
    model's ``MAX_CHARS``; one block's text in memory at a time, whatever the log's size."""
    cut = embedder.MAX_CHARS
    first = [
        str(r[0] or "").strip()
        for r in conn.execute(
            "SELECT substr(unz(zbody), 1, ?) FROM blocks WHERE conv = ? ORDER BY block LIMIT ?",
            (cut, conv_id, FIRST_BLOCKS),
        )
    ]
    head = "\n".join([topic.strip(), *first]).strip()[:cut]
    out = {CONV_AT: head} if head else {}
    long_ones = conn.execute(
        "SELECT at, substr(unz(zbody), 1, ?) FROM blocks WHERE conv = ? AND block > ? AND "
        "length(zbody) >= ? ORDER BY block LIMIT ?",
        (cut, conv_id, FIRST_BLOCKS, LONG_Z, MAX_LONG),
    )
    for at, text in long_ones:
        out[int(at)] = str(text or "")
    return out


def question_of(conn: sqlite3.Connection, conv_id: str) -> str:
    """A conversation's opening question: its first block by the agent (a message or its
    own answer), cut to the model's ``MAX_CHARS``; "" with none."""
    row = conn.execute(
        "SELECT substr(unz(zbody), 1, ?) FROM blocks WHERE conv = ? AND own = 1 "
        "ORDER BY block LIMIT 1",
        (embedder.MAX_CHARS, conv_id),
    ).fetchone()
    return "" if row is None else str(row[0] or "").strip()


def pending_count(conn: sqlite3.Connection, model: str | None = None) -> int:
    """How many conversations lack current vectors of ``model`` (None: the current one): a
    search by meaning may miss them."""
    return pending.count(conn, embedder.tag() if model is None else model)


def _pending(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """The conversations whose vectors are not of their log as it is: (id, topic, key)."""
    return [
        (str(r[0]), str(r[1] or ""), str(r[2]))
        for r in conn.execute(
            "SELECT c.id, c.topic, coalesce(c.log_key, '') || '|' || coalesce(c.topic, '') || ? "
            f"{pending.STALE} ORDER BY c.last_ts DESC",
            (_key_tail(), _key_tail()),
        ).fetchall()
    ]


def _embed_one(conn: sqlite3.Connection, conv_id: str, topic: str, key: str) -> int:
    """One conversation's vectors brought up to date (the model runs outside any
    transaction); how many texts were embedded."""
    wanted = texts_of(conn, conv_id, topic)
    digests = {at: _digest(t) for at, t in wanted.items()}
    asked = question_of(conn, conv_id)
    if asked:  # embedded as a query (the digest says so)
        wanted[QUESTION_AT], digests[QUESTION_AT] = asked, _digest(f"query: {asked}")
    have = dict(conn.execute("SELECT at, digest FROM vectors WHERE conv = ?", (conv_id,)))
    todo = [at for at in wanted if have.get(at) != digests[at] and at != QUESTION_AT]
    vecs = list(embedder.passages([wanted[at] for at in todo]))
    if QUESTION_AT in wanted and have.get(QUESTION_AT) != digests[QUESTION_AT]:
        todo.append(QUESTION_AT)
        vecs.append(embedder.queries([asked])[0])
    conn.execute("BEGIN IMMEDIATE")
    try:
        for at in set(have) - set(wanted):
            conn.execute("DELETE FROM vectors WHERE conv = ? AND at = ?", (conv_id, at))
        conn.executemany(
            "INSERT OR REPLACE INTO vectors (conv, at, digest, vec) VALUES (?, ?, ?, ?)",
            [(conv_id, at, digests[at], _blob(v)) for at, v in zip(todo, vecs, strict=True)],
        )
        conn.execute("INSERT OR REPLACE INTO vec_done (conv, key) VALUES (?, ?)", (conv_id, key))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return len(todo)


def _drop_gone(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("DELETE FROM vectors WHERE conv NOT IN (SELECT id FROM convs)")
        conn.execute("DELETE FROM vec_done WHERE conv NOT IN (SELECT id FROM convs)")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@dataclass(frozen=True, slots=True)
class Progress:
    embedded: int  # texts embedded
    left: int  # conversations still to do (0: all current)


def embed_pending(
    conn: sqlite3.Connection,
    seconds: float | None = UPDATE_SECONDS,
    progress: Callable[[int, int], None] | None = None,
) -> Progress:
    """On an open index: vectors for the conversations that lack current ones, newest first,
    until ``seconds`` have passed (None: all of them)."""
    _drop_gone(conn)
    pending = _pending(conn)
    until = None if seconds is None else time.monotonic() + seconds
    done = embedded = 0
    for conv_id, topic, key in pending:
        if until is not None and time.monotonic() >= until:
            break
        embedded += _embed_one(conn, conv_id, topic, key)
        done += 1
        if progress is not None:
            progress(done, len(pending))
    try:
        keep_crowds(conn)
    except sqlite3.OperationalError as exc:  # locked past the busy wait: the next slice keeps them
        db.log.warning("crowds_not_kept", error=str(exc))
    return Progress(embedded, len(pending) - done)


def update(home: Home, seconds: float | None = UPDATE_SECONDS) -> Progress:
    """The index brought up to date, then its missing vectors made (within ``seconds``);
    nothing when the semantic extra is not installed."""
    if not embedder.available():
        return Progress(0, 0)
    return db.read(home, lambda conn: embed_pending(conn, seconds), fallback=False)


def _blob(v: Matrix) -> bytes:
    return np.asarray(v, dtype=np.float16).tobytes()


# -- ranking -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Table:
    """Every vector a conversation scores by as one matrix: each row's conversation (an
    index into ``names``) and block offset; and the conversations' questions as another."""

    stamp: tuple[int, int, int | None]
    names: list[str]
    codes: npt.NDArray[np.int64]
    ats: npt.NDArray[np.int64]
    mat: Matrix
    crowd: Matrix  # each row's crowd (:func:`crowds`), times CROWD_WEIGHT
    gen: int | None  # the vectors' write count they were read at (None: not known)
    kept: bool  # the crowds were read from the index, not computed
    every: Matrix  # every row's crowd, questions too, in the table's rowid order (kept so)
    q_codes: npt.NDArray[np.int64]  # the questions' conversations (into ``names``)
    q_mat: Matrix
    q_crowd: Matrix  # each question's crowd among the questions, times CROWD_WEIGHT


_cache_lock = threading.Lock()
_cache: dict[str, _Table] = {}


def _gen(conn: sqlite3.Connection) -> int | None:
    """How many writes the vectors table has had since it was made (None: not counted, as in
    an index an older version made)."""
    try:
        row = conn.execute("SELECT gen FROM vec_gen").fetchone()
    except sqlite3.OperationalError:  # no such table
        return None
    return None if row is None else int(row[0])


@dataclass(frozen=True, slots=True)
class _Kept:
    gen: int
    n: int
    blob: bytes


def _kept(conn: sqlite3.Connection, model: str) -> _Kept | None:
    """The crowds kept for ``model``'s vectors, if computed by this rule and while the
    vectors' writes were counted (None: none to trust)."""
    marks = ", ".join("?" * len(_TRIGGERS))
    try:
        row = conn.execute(
            "SELECT gen, n, crowd, (SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "  # noqa: S608 - ? marks only
            f"AND name IN ({marks})) FROM vec_crowds WHERE model = ? AND rule = ?",
            (*_TRIGGERS, model, CROWD_RULE),
        ).fetchone()
    except sqlite3.OperationalError:  # no such table
        return None
    if row is None or int(row[3]) != len(_TRIGGERS):
        return None
    return _Kept(int(row[0]), int(row[1]), bytes(row[2]))


def _matrix(conn: sqlite3.Connection, model: str | None = None) -> _Table:
    """Every vector of ``model`` (None: the current one) as one matrix, read again only when
    the table changed (its largest rowid, its count and its write count), with each row's
    crowd: kept in the index when current, else computed."""
    model = embedder.tag() if model is None else model
    stamp_row = conn.execute("SELECT coalesce(max(rowid), 0), count(*) FROM vectors").fetchone()
    gen = _gen(conn)
    stamp = (int(stamp_row[0]), int(stamp_row[1]), gen)
    where, args = _mine(model)
    path = str(conn.execute("PRAGMA database_list").fetchone()[2]) or f":memory:{id(conn)}"
    path += "\0" + model
    with _cache_lock:
        got = _cache.get(path)
        if got is not None and got.stamp == stamp:
            return got
    kept = _kept(conn, model) if gen is not None else None
    rows = conn.execute(
        f"SELECT conv, at, vec FROM vectors WHERE {where} ORDER BY rowid",  # noqa: S608
        args,
    ).fetchall()
    if _gen(conn) != gen:  # written meanwhile: read as it was, kept for none
        gen = kept = None
    ats = np.array([int(r[1]) for r in rows], dtype=np.int64)
    asked = ats == QUESTION_AT
    index: dict[str, int] = {}
    codes = np.array(
        [
            index.setdefault(str(r[0]), len(index))
            for r, q in zip(rows, asked, strict=True)
            if not q
        ],
        dtype=np.int64,
    )
    q_codes = np.array(
        [index.get(str(r[0]), -1) for r in rows if r[1] == QUESTION_AT], dtype=np.int64
    )
    raw = b"".join(r[2] for r in rows)
    dim = len(rows[0][2]) // 2 if rows else embedder.DIM
    full = np.frombuffer(raw, dtype=np.float16).reshape(len(rows), dim).astype(np.float32)
    mat, q_mat = full[~asked], full[asked]
    use = kept is not None and kept.gen == gen and kept.n == len(rows) == len(kept.blob) // 4
    if use and kept:
        every = np.frombuffer(kept.blob, dtype=np.float32)
    else:  # each kind among its own kind: a question's crowd is the questions near it
        every = np.zeros(len(rows), dtype=np.float32)
        every[~asked] = crowds(mat, codes)
        if asked.any():
            every[asked] = crowds(q_mat, np.arange(len(q_mat), dtype=np.int64))
    near, q_near = every[~asked], every[asked]
    mine = q_codes >= 0  # a question of a conversation with no other vector: none to add to
    table = _Table(
        stamp, list(index), codes, ats[~asked], mat, CROWD_WEIGHT * near, gen, use,
        every, q_codes[mine], q_mat[mine], CROWD_WEIGHT * q_near[mine],
    )  # fmt: skip
    with _cache_lock:
        _cache.clear()  # one home a process at a time is the rule: bounded to one matrix
        _cache[path] = table
    return table


def _count_writes(conn: sqlite3.Connection) -> None:
    """The tables and triggers that count the vectors' writes and keep their crowds, made
    where missing; where the triggers were missing (an index an older version made, or its
    vectors table made anew), any crowds kept are dropped: nothing says what they were
    computed from."""
    have = {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE name IN ('vec_gen', 'vec_crowds') OR "
            "(type = 'trigger' AND tbl_name = 'vectors')"
        )
    }
    if have >= {"vec_gen", "vec_crowds", *_TRIGGERS}:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS vec_gen (one INTEGER PRIMARY KEY CHECK (one = 1), "
            "gen INTEGER NOT NULL)"
        )
        conn.execute("INSERT OR IGNORE INTO vec_gen (one, gen) VALUES (1, 0)")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS vec_crowds (model TEXT PRIMARY KEY, gen INTEGER NOT "
            "NULL, rule TEXT NOT NULL, n INTEGER NOT NULL, crowd BLOB NOT NULL)"
        )
        conn.execute("DELETE FROM vec_crowds")
        for name, what in zip(_TRIGGERS, ("INSERT", "DELETE", "UPDATE"), strict=True):
            conn.execute(
                f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {what} ON vectors "  # noqa: S608 - constants
                "BEGIN UPDATE vec_gen SET gen = gen + 1; END"
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def keep_crowds(conn: sqlite3.Connection, model: str | None = None) -> bool:
    """The crowds of ``model``'s vectors (None: the current model's) kept in the index, when
    they are not already for the vectors as they are; whether they were written. Never over
    vectors written meanwhile (by another process): those are left to the next call."""
    model = embedder.tag() if model is None else model
    _count_writes(conn)
    gen = _gen(conn)
    where, args = _mine(model)
    n = int(conn.execute(f"SELECT count(*) FROM vectors WHERE {where}", args).fetchone()[0])  # noqa: S608
    kept = _kept(conn, model)
    if not n or (kept is not None and (kept.gen, kept.n) == (gen, n)):
        return False
    t = _matrix(conn, model)
    if t.gen is None or t.gen != gen or t.kept:
        return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _gen(conn) != t.gen:
            conn.execute("ROLLBACK")
            return False
        conn.execute("DELETE FROM vec_crowds WHERE gen != ? OR model = ?", (t.gen, model))
        conn.execute(
            "INSERT INTO vec_crowds (model, gen, rule, n, crowd) VALUES (?, ?, ?, ?, ?)",
            (model, t.gen, CROWD_RULE, len(t.every), t.every.astype(np.float32).tobytes()),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True


def crowds(mat: Matrix, codes: npt.NDArray[np.int64], chunk: int = 1024) -> Matrix:
    """Each row's crowd: the mean cosine of its :data:`CROWD_K` nearest rows of other
    conversations (``codes``) that are not copies of it, among :data:`CROWD_REFS` rows at most
    (evenly spread); 0 with none. Computed ``chunk`` rows at a time (memory bounded)."""
    n = len(mat)
    out = np.zeros(n, dtype=np.float32)
    refs = np.unique(np.linspace(0, n - 1, min(n, CROWD_REFS)).astype(np.int64)) if n else codes
    k = min(CROWD_K, len(refs))
    if k == 0:
        return out
    ref_mat, ref_codes = mat[refs].T, codes[refs][None, :]
    for start in range(0, n, chunk):
        sims = mat[start : start + chunk] @ ref_mat
        mine = codes[start : start + chunk, None] == ref_codes
        sims[mine | (sims > CROWD_SAME)] = -np.inf
        near = np.partition(sims, -k, axis=1)[:, -k:]
        counted = np.isfinite(near).sum(axis=1)
        sums = np.where(np.isfinite(near), near, 0.0).sum(axis=1)
        out[start : start + chunk] = np.where(counted > 0, sums / np.maximum(counted, 1), 0.0)
    return out


@dataclass(frozen=True, slots=True)
class Ranking:
    """Conversations by meaning, best first, and the query's scores over all of those
    searched (what :mod:`contemplation.index.relevance` reads a score against)."""

    near: list[Near]
    calibration: relevance.Calibration


def rank(
    conn: sqlite3.Connection,
    vec: Matrix,
    allowed: set[str] | None = None,
    *,
    exclude: str = "",
    depth: int = 200,
    model: str | None = None,
    question: bool = True,
) -> Ranking:
    """Conversations by their best vector's cosine with ``vec`` (less its crowd), plus their
    question's term (``question``: ``vec`` is a search's query), best first, ``depth`` at
    most, among ``allowed`` (None: all); calibrated on every allowed conversation's score.
    Only the vectors ``model`` made are read (None: the current model's): pass the model
    that made ``vec``, so a query is never compared with another model's vectors."""
    t = _matrix(conn, model)
    if not t.names:
        return Ranking([], relevance.Calibration(0.0, 0.0, 0))
    if t.mat.shape[1] != vec.shape[-1]:  # one model's vectors all have one length
        raise InputRejected(
            f"the query's vector has {vec.shape[-1]} numbers and the index's {t.mat.shape[1]}: "
            "made by two models (contemplation reindex makes them anew)"
        )
    scores = t.mat @ vec - t.crowd
    best = np.full(len(t.names), -np.inf, dtype=np.float32)
    np.maximum.at(best, t.codes, scores)
    if question and len(t.q_codes):
        term = t.q_mat @ vec - t.q_crowd
        best[t.q_codes] += QUESTION_WEIGHT * (term - np.float32(np.median(term)))
    keep = np.ones(len(t.names), dtype=bool)
    if allowed is not None:
        keep = np.fromiter((n in allowed for n in t.names), dtype=bool, count=len(t.names))
    if exclude:
        keep &= np.array([n != exclude for n in t.names], dtype=bool)
    mine = best[keep]
    cal = relevance.Calibration(
        float(np.median(mine)) if mine.size else 0.0,
        float(mine.std()) if mine.size else 0.0,
        int(mine.size),
    )
    # each conversation's best vector (the first, by score then row): what a hit shows, and
    # what orders conversations of one score
    order = np.argsort(-scores, kind="stable")
    _, first = np.unique(t.codes[order], return_index=True)
    top = order[first]
    out: list[Near] = []
    for c in np.lexsort((first, -best)):
        if not keep[c]:
            continue
        out.append(Near(t.names[c], float(best[c]), int(t.ats[top[c]])))
        if len(out) >= depth:
            break
    return Ranking(out, cal)


def covered(conn: sqlite3.Connection, q: Query) -> set[str]:
    """The conversations a listing query covers."""
    where, args = q.clauses("c.")
    sql = "SELECT c.id FROM convs c WHERE " + " AND ".join(["1", *where])  # noqa: S608
    return {str(r[0]) for r in conn.execute(sql, args)}


def conv_vector(
    conn: sqlite3.Connection, conv_id: str, server: served.Server | bool | None = True
) -> Matrix | None:
    """A conversation's own vector by ``server`` (True: the current model), made now when it
    has none yet (None: no text at all)."""
    where, args = _mine(embedder.tag(server))
    row = conn.execute(
        f"SELECT vec FROM vectors WHERE conv = ? AND at = ? AND {where}",  # noqa: S608
        (conv_id, CONV_AT, *args),
    ).fetchone()
    if row is not None:
        return np.frombuffer(row[0], dtype=np.float16).astype(np.float32)
    topic = conn.execute("SELECT topic FROM convs WHERE id = ?", (conv_id,)).fetchone()
    text = texts_of(conn, conv_id, str(topic[0] or "") if topic else "").get(CONV_AT)
    return None if text is None else embedder.passages([text], server)[0]
