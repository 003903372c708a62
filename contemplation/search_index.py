"""Full-text search over every conversation, active and archived, with a derived SQLite index.

The folders stay the truth: the index (``<home>/.index.sqlite3``, WAL) can be deleted at any
time and is brought up to date before each search by comparing what it recorded of each
folder (its own, its log's and its state's size and mtime) with what is on disk now, so a
conversation made or edited by hand is found without a restart. A missing, corrupt or other-
version database is made anew with one log line; it never stops a search.

Blocks are indexed with their text (headers and framing left out, as the parser gives it) and
their thinking in a column of its own, searched only when asked. Ranking is FTS5's bm25,
newest activity first on ties. FTS5 query syntax passes through; a query it rejects is tried
again as a phrase.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from contemplation.errors import InputRejected
from contemplation.layout import (
    Conv,
    Home,
    log_segments,
    parse_segment,
    read_json,
    valid_id,
)

log = structlog.get_logger("contemplation.search_index")

SCHEMA = 2  # 2: the owned table (1 deleted a conversation's rows by a full scan)
DB_NAME = ".index.sqlite3"
BUSY_MS = 5000  # another process writing: wait this long for it
MAX_LIMIT = 200
_DDL = (
    "CREATE TABLE convs (id TEXT PRIMARY KEY, archived INTEGER, topic TEXT, model TEXT, "
    "backend TEXT, status TEXT, last_ts REAL, blocks INTEGER, key TEXT)",
    # which rows of the text table a conversation owns (an FTS5 column cannot be indexed)
    "CREATE TABLE owned (conv TEXT, rid INTEGER)",
    "CREATE INDEX owned_conv ON owned (conv)",
    "CREATE VIRTUAL TABLE text USING fts5(conv UNINDEXED, block UNINDEXED, sender UNINDEXED, "
    "time UNINDEXED, body, thinking, tokenize = 'unicode61')",
)


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
        }


def db_path(home: Home) -> Path:
    return home.root / DB_NAME


@contextlib.contextmanager
def opened(home: Home) -> Iterator[sqlite3.Connection]:
    """The index, made (or made anew) when it is missing, corrupt or of another version."""
    path = db_path(home)
    home.root.mkdir(parents=True, exist_ok=True)
    try:
        conn = _connect(path)
    except sqlite3.DatabaseError as exc:
        log.warning("index_rebuilt", why=str(exc))
        _remove(path)
        conn = _connect(path)
    try:
        yield conn
    finally:
        conn.close()


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA:
            if version:
                log.warning("index_rebuilt", why=f"schema {version}, this version reads {SCHEMA}")
            conn.execute("BEGIN IMMEDIATE")
            for table in ("convs", "owned", "text"):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            for ddl in _DDL:
                conn.execute(ddl)
            conn.execute(f"PRAGMA user_version={SCHEMA}")
            conn.execute("COMMIT")
        conn.execute("SELECT count(*) FROM convs").fetchone()  # a truncated file fails here
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _remove(path: Path) -> None:
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _key(folder: str) -> str:
    """What the index recorded of a folder (its own, its log's and its state's inode, size and
    mtime; metadata.json is replaced by a rename, which the folder's mtime shows): a change in
    it means the folder changed. Plain strings and system calls: it runs for every folder."""
    parts = []
    for p in (folder, folder + "/messages.log", folder + "/state.json"):
        try:
            st = os.stat(p, follow_symlinks=False)
        except FileNotFoundError:
            parts.append("-")
            continue
        parts.append(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _folders(home: Home) -> dict[str, str]:
    out: dict[str, str] = {}
    for d in (home.active, home.completed):
        try:
            with os.scandir(d) as it:
                for e in it:
                    if valid_id(e.name) and e.is_dir(follow_symlinks=False):
                        out.setdefault(e.name, e.path)
        except FileNotFoundError:
            continue
    return out


def refresh(conn: sqlite3.Connection, home: Home) -> int:
    """Bring the index up to date with the folders; how many conversations were (re)read."""
    known = dict(conn.execute("SELECT id, key FROM convs").fetchall())
    folders = _folders(home)
    changed = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for gone in set(known) - set(folders):
            conn.execute("DELETE FROM convs WHERE id = ?", (gone,))
            _forget(conn, gone)
        for conv_id, folder in folders.items():
            key = _key(folder)
            if known.get(conv_id) == key:
                continue
            if conv_id in known:
                _forget(conn, conv_id)
            _index(conn, Conv(Path(folder)), key)
            changed += 1
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return changed


def drift(home: Home) -> dict[str, list[str]]:
    """What the index does not know yet, without writing: conversations it lacks, holds
    though they are gone, or recorded before they changed."""
    folders = _folders(home)
    with opened(home) as conn:
        known = dict(conn.execute("SELECT id, key FROM convs").fetchall())
    return {
        "missing": sorted(set(folders) - set(known)),
        "gone": sorted(set(known) - set(folders)),
        "changed": sorted(c for c, f in folders.items() if c in known and known[c] != _key(f)),
    }


def rebuild(home: Home, progress: Callable[[int, int], None] | None = None) -> int:
    """The index made anew from the folders (``progress(done, total)`` as it goes); how many
    conversations it holds."""
    _remove(db_path(home))
    folders = _folders(home)
    with opened(home) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for done, (_, folder) in enumerate(sorted(folders.items()), 1):
                _index(conn, Conv(Path(folder)), _key(folder))
                if progress is not None:
                    progress(done, len(folders))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(folders)


def _index(conn: sqlite3.Connection, conv: Conv, key: str) -> None:
    meta = read_json(conv.metadata) or {}  # plain JSON: a few fields, no model to build
    state = read_json(conv.state) or {}
    label = str(meta.get("agent_label") or "CLAUDE")
    rows: list[tuple[str, int, str, str, str, str]] = []
    for seg in log_segments(conv):
        try:
            data = seg.read_bytes()
        except OSError:
            continue
        for b in parse_segment(data, agent_label=label).blocks:
            rows.append((conv.id, len(rows) + 1, b.sender, b.timestamp, b.text, b.thinking))
    owned = []
    for row in rows:
        cur = conn.execute(
            "INSERT INTO text (conv, block, sender, time, body, thinking) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            row,
        )
        owned.append((conv.id, cur.lastrowid))
    conn.executemany("INSERT INTO owned VALUES (?, ?)", owned)
    conn.execute(
        "INSERT OR REPLACE INTO convs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            conv.id,
            int(conv.is_completed),
            str(meta.get("topic", "")),
            str(meta.get("model", "")),
            str(meta.get("backend", "")),
            str(state.get("status", "pending")),
            _last_ts(conv, rows[-1][3] if rows else ""),
            len(rows),
            key,
        ),
    )


def _forget(conn: sqlite3.Connection, conv_id: str) -> None:
    conn.execute(
        "DELETE FROM text WHERE rowid IN (SELECT rid FROM owned WHERE conv = ?)", (conv_id,)
    )
    conn.execute("DELETE FROM owned WHERE conv = ?", (conv_id,))


def _last_ts(conv: Conv, last_time: str) -> float:
    """The newest of the log's last dated header and the folder's files' times: a folder
    copied by hand shows when it was really used, not when it was copied."""
    from datetime import datetime

    if last_time:
        with contextlib.suppress(ValueError):
            return datetime.strptime(last_time, "%Y-%m-%d %H:%M:%S").timestamp()
    try:
        return os.stat(conv.log).st_mtime
    except OSError:
        return 0.0


def search(
    home: Home,
    query: str,
    *,
    include_archived: bool = False,
    thinking: bool = False,
    limit: int = 20,
) -> list[Hit]:
    """The blocks that match ``query``, best first (bm25), newest conversation first on ties."""
    if not query.strip():
        raise InputRejected("the search needs a query")
    limit = min(max(int(limit), 1), MAX_LIMIT)
    with opened(home) as conn:
        refresh(conn, home)
        try:
            return _run(conn, query, include_archived, thinking, limit)
        except sqlite3.OperationalError:
            phrase = '"' + query.replace('"', '""') + '"'  # not FTS5 syntax: the words as said
            try:
                return _run(conn, phrase, include_archived, thinking, limit)
            except sqlite3.OperationalError as exc:
                raise InputRejected(f"cannot search for {query!r}: {exc}") from None


def _run(
    conn: sqlite3.Connection, query: str, archived: bool, thinking: bool, limit: int
) -> list[Hit]:
    columns = "{body thinking}" if thinking else "{body}"
    rows = conn.execute(
        "SELECT t.conv, c.topic, c.archived, c.status, t.block, t.sender, t.time, "
        "snippet(text, -1, '«', '»', '…', 16) "  # about 16 words around the match
        "FROM text t JOIN convs c ON c.id = t.conv "
        "WHERE text MATCH ? AND (? OR c.archived = 0) "
        "ORDER BY bm25(text), c.last_ts DESC LIMIT ?",
        (f"{columns} : ({query})", int(archived), limit),
    ).fetchall()
    return [Hit(r[0], r[1], bool(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]
