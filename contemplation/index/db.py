"""The derived index of every conversation: one SQLite database under the home.

The folders stay the truth. ``<home>/.index.sqlite3`` (WAL, ``synchronous=NORMAL``: it can be
made again at any time) holds one row per conversation, with the summary every face shows,
and an FTS5 table over the blocks' text (headers and framing left out; thinking in a column
of its own). Whoever reads it first brings it up to date: each folder's own stat and its log's
are compared with what was recorded, a folder whose state alone changed gets its row read
again, one whose log changed gets its text indexed again, and a folder that is gone loses
its rows. So a conversation made, edited, restored or deleted by hand is seen without a
restart, by the daemon, the CLI, the MCP server and the dashboard alike.

A missing, truncated, corrupt or other-version database is made anew with one log line; a
database another process holds locked past the busy timeout is read as it stands (WAL lets
readers through a writer). One that cannot be opened or written (a full disk, an I/O error, a
read-only file) is never thrown away: a read then brings a copy in memory up to date from the
folders instead (:func:`read`), and a write says the disk is full as any file's would (an
``OSError`` of ENOSPC naming the index). Nothing here raises for the index's sake.

SQLite follows symbolic links, so the path is looked at first (``lstat``): the index and its
``-wal``, ``-shm`` and ``-journal`` must each be missing or a regular file of this user's. A
link (to a database outside the home, whose tables a migration would drop), a folder or
another user's file is refused in one line (:class:`IndexRefused`), never opened: reads come
from the folders then, as above, and a command that must write says it. A folder whose files
cannot be read (a state.json nested too deeply, a number no float holds) costs its own row,
which says what is wrong (``status`` "unreadable", ``problem``), never the whole refresh.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import stat
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from contemplation.base.privacy import DIR_MODE, FILE_MODE
from contemplation.base.testing import crashpoint
from contemplation.errors import InputRejected
from contemplation.index.rows import Facts, as_int, disk_use, header_ts, summary_row
from contemplation.store import room
from contemplation.store.layout import (
    Conv,
    Home,
    open_regular_stat,
    read_json_why,
    valid_id,
)

if TYPE_CHECKING:
    from contemplation.models import Block

# What reading the log into the index needs (the models, the log's parser) is imported where a
# conversation is indexed: a read of an index that is up to date (``list``, ``search``) loads
# none of it (tests/system/test_read_commands_light.py).


class _Log:
    """The index's log: structlog is loaded with its first line (a read of an index that is
    up to date says nothing, and loads no logging)."""

    def __getattr__(self, level: str) -> Any:
        import structlog

        return getattr(structlog.get_logger("contemplation.index"), level)


log = _Log()

T = TypeVar("T")

# 8: the ladder table (each conversation's escalation book: turns answered per rung, escalated,
#    to the agent, tokens not spent);
# 7: the vectors of meaning (index/semantic.py; derived like the rest);
# 5: the ledger table (each conversation's tokens and times per provider/model);
# 4: each block marked as the agent's own (a message or its own answer; a tool's answer is
#    not: "messages N from the agent"); 3: one summary row per conversation (turns, messages
#    and activity from the log's own blocks); 2: the owned table; 1: the first
SCHEMA = 8
DB_NAME = ".index.sqlite3"
BUSY_MS = 5000  # another process writing: wait this long for it, then read what is there
FULL_SWEEP_S = 60  # archived folders are looked at one by one at least this often
NOTICE_AT = 500  # a refresh that reads this many folders again says so on a terminal
BATCH = 200  # conversations indexed per transaction: a long rebuild lets others in between
SAY_EVERY_S = 60.0  # an index that cannot be written is said at most this often (a warning)

_COLUMNS = (
    "id TEXT PRIMARY KEY, archived INTEGER NOT NULL, topic TEXT, model TEXT, backend TEXT, "
    "template TEXT, status TEXT, created TEXT, last_ts REAL, blocks INTEGER, "
    "agent_msgs INTEGER, model_turns INTEGER, tokens_in INTEGER, tokens_out INTEGER, "
    "bytes INTEGER, disk INTEGER, log_ts REAL, hay TEXT, topic_key TEXT, row TEXT, key TEXT, "
    "log_key TEXT"
)


def _ddl() -> tuple[str, ...]:
    """Every table and index (the ledger's columns are the protocol's figures)."""
    from contemplation.protocol.ledger import FIELDS

    figures = ", ".join(f"{c} REAL" for c in FIELDS)
    return (
        f"CREATE TABLE convs ({_COLUMNS})",
        "CREATE INDEX convs_recent ON convs (archived, last_ts DESC, id DESC)",
        # each block, its text kept compressed (zlib: about half the bytes; the FTS5 table reads
        # it through the view, for snippets and to delete a block's terms)
        "CREATE TABLE blocks (id INTEGER PRIMARY KEY, conv TEXT NOT NULL, block INTEGER, "
        "sender TEXT, time TEXT, at INTEGER, own INTEGER, zbody BLOB, zthinking BLOB)",
        "CREATE INDEX blocks_conv ON blocks (conv)",
        "CREATE VIEW block_text AS SELECT id, unz(zbody) AS body, unz(zthinking) AS thinking "
        "FROM blocks",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",  # the last full sweep's mark
        # state.json's ledger summed per provider/model (NULL: no turn said); summed over every
        # conversation in SQL, never by reading folders
        f"CREATE TABLE ledger (conv TEXT NOT NULL, archived INTEGER NOT NULL, provider TEXT, "
        f"model TEXT, turns INTEGER, {figures}, "
        "context_bytes INTEGER)",
        "CREATE INDEX ledger_conv ON ledger (conv)",
        # state.json's escalation book: a row per rung with the turns it answered, and one row
        # (rung NULL) with the turns escalated, those that reached the agent and the tokens not
        # spent; summed over every conversation in SQL (index/ledger.py's ladder)
        "CREATE TABLE ladder (conv TEXT NOT NULL, archived INTEGER NOT NULL, rung TEXT, "
        "answered INTEGER NOT NULL, escalated INTEGER NOT NULL, to_agent INTEGER NOT NULL, "
        "saved INTEGER NOT NULL)",
        "CREATE INDEX ladder_conv ON ladder (conv)",
        "CREATE VIRTUAL TABLE text USING fts5(body, thinking, content = 'block_text', "
        "content_rowid = 'id', tokenize = 'unicode61')",
        # the blocks past the reader's bound (logstream.MAX_BLOCK_BYTES), indexed by their first
        # ``kept`` bytes of ``bytes``: words past that are not found, and searches say so
        "CREATE TABLE cut (conv TEXT NOT NULL, at INTEGER, bytes INTEGER, kept INTEGER)",
        "CREATE INDEX cut_conv ON cut (conv, at)",
        # index/semantic.py's: a vector per conversation (at -1) and per long block (its offset),
        # with the digest of the text it was made from; vec_done: the log_key last embedded
        "CREATE TABLE vectors (conv TEXT NOT NULL, at INTEGER NOT NULL, digest TEXT NOT NULL, "
        "vec BLOB NOT NULL, PRIMARY KEY (conv, at))",
        "CREATE TABLE vec_done (conv TEXT PRIMARY KEY, key TEXT NOT NULL)",
    )


_TABLES = (
    "convs", "owned", "blocks", "text", "meta", "ledger", "ladder", "cut", "vectors", "vec_done",
)  # fmt: skip
_VIEWS = ("block_text",)


SIDE_FILES = ("-wal", "-shm", "-journal")  # what SQLite opens beside the database


class IndexRefused(InputRejected):
    """The index's path (or a file SQLite keeps beside it) is no file of this user's to open:
    a symbolic link, a folder, another user's file. Never opened, never removed."""


def db_path(home: Home) -> Path:
    return home.root / DB_NAME


def refusal(path: Path) -> str:
    """Why the index at ``path`` must not be opened, in one line ("": it may). Looked at
    without following links (SQLite would follow them)."""
    uid = os.getuid()
    for p in (path, *(Path(f"{path}{side}") for side in SIDE_FILES)):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError:
            continue  # SQLite says what is wrong when it opens it
        what = f"the index {p}" if p == path else f"the index's {p}"
        if stat.S_ISLNK(st.st_mode):
            why = "is a symbolic link: it is never followed"
        elif stat.S_ISDIR(st.st_mode):
            why = "is a folder, not a regular file"
        elif not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_uid != uid:
            why = f"belongs to uid {st.st_uid}, not to you (uid {uid}): it is not opened"
        else:
            continue
        return f"{what} {why} (move it away and the index is made anew)"
    return ""


def _refuse(path: Path) -> None:
    why = refusal(path)
    if why:
        raise IndexRefused(why)


def _connect(path: Path) -> sqlite3.Connection:
    _refuse(path)
    # made owner-only before SQLite opens it: its -wal and -shm take the database's mode
    with contextlib.suppress(OSError):  # (SQLite then says what is wrong, as it would)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE))
    conn = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)
    conn.create_function("unz", 1, _unz, deterministic=True)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA:
            _migrate(conn, version)
        conn.execute("SELECT count(*) FROM convs").fetchone()  # a truncated file fails here
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, version: int, *, say: bool = True) -> None:
    """Every older (or newer) schema is made anew: the index is derived, so its migration is
    a rebuild (the folders are read again by the next refresh)."""
    if version and say:
        log.warning("index_rebuilt", why=f"schema {version}, this version reads {SCHEMA}")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA:  # another did it
            conn.execute("COMMIT")
            return
        _make_tables(conn)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _make_tables(conn: sqlite3.Connection) -> None:
    """Every table dropped and made empty, in the caller's transaction."""
    for view in _VIEWS:
        conn.execute(f"DROP VIEW IF EXISTS {view}")
    for table in _TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    for ddl in _ddl():
        conn.execute(ddl)
    conn.execute(f"PRAGMA user_version={SCHEMA}")


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo the open transaction, if SQLite has not already (it does on a full disk): the
    error that ended it is the one raised, never 'cannot rollback'."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


# --------------------------------------------------------------------------- what went wrong


def _code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``exc`` (None: an error of Python's own module)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def _damaged(exc: sqlite3.Error) -> bool:
    """The file is no index this code can read: corrupt, not a database, a table missing (a
    truncated file, one made by someone else). Only that is thrown away and made anew; a full
    disk, an I/O error, a read-only file or a lock held past the timeout leave it alone."""
    return _code(exc) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_ERROR)


def _busy(exc: sqlite3.Error) -> bool:
    return _code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _no_room(folder: Path) -> bool:
    return bool(room.full(folder))


@contextlib.contextmanager
def _full_disk_said(home: Home) -> Iterator[None]:
    """SQLite's full disk as the ``OSError`` any other file's write raises, naming the index.
    SQLite says 'disk I/O error' when it cannot grow the WAL's shared memory: on a disk with
    no room left, that is the full disk too."""
    try:
        yield
    except sqlite3.Error as exc:
        code = _code(exc)
        if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and _no_room(home.root)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(db_path(home))) from exc
        raise


_said_at = [float("-inf")]  # when the last index_unwritable warning went out (monotonic)


def _say_unwritable(exc: Exception) -> None:
    """One warning a minute at most: a dashboard polling a full disk must not fill the log."""
    now = time.monotonic()
    if now - _said_at[0] < SAY_EVERY_S:
        log.debug("index_unwritable", why=str(exc))
        return
    _said_at[0] = now
    log.warning("index_unwritable", why=str(exc), reading="the folders, into memory")


def _remove(path: Path) -> None:
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


@contextlib.contextmanager
def opened(home: Home) -> Iterator[sqlite3.Connection]:
    """The index, made (or made anew) when it is missing, corrupt or of another version."""
    path = db_path(home)
    home.root.mkdir(DIR_MODE, parents=True, exist_ok=True)
    try:
        conn = _connect(path)
    except sqlite3.DatabaseError as exc:
        if not _damaged(exc):
            raise  # full, read-only, locked: the file is left as it is
        conn = _anew(path, exc)
    try:
        yield conn
    finally:
        conn.close()


def _anew(path: Path, exc: Exception) -> sqlite3.Connection:
    log.warning("index_rebuilt", why=str(exc))
    _remove(path)
    return _connect(path)


def read(
    home: Home,
    fn: Callable[[sqlite3.Connection], T],
    only: Iterable[str] | None = None,
    *,
    fallback: bool = True,
) -> T:
    """``fn`` run on the index after it was brought up to date (with every folder, or with
    ``only`` these conversations). A database that turns out damaged on the way is made anew
    once; one that stays locked is read as it stands. One that cannot be opened or written (a
    full disk, an I/O error, a read-only file) is left as it is: ``fn`` runs on a copy in
    memory brought up to date from the folders (one warning a minute), or, with ``fallback``
    False, the error is raised (a full disk as ``OSError``)."""
    if not fallback:
        with _full_disk_said(home):
            return _read_on_disk(home, fn, only)
    try:
        return _read_on_disk(home, fn, only)
    except (sqlite3.DatabaseError, IndexRefused) as exc:
        _say_unwritable(exc)
    return _read_in_memory(home, fn, only)


def _read_on_disk(
    home: Home, fn: Callable[[sqlite3.Connection], T], only: Iterable[str] | None
) -> T:
    for attempt in (1, 2):
        try:
            with opened(home) as conn:
                try:
                    refresh(conn, home, only)
                except sqlite3.OperationalError as exc:
                    if not _busy(exc):
                        raise
                    log.info("index_busy", why=str(exc), reading="the index as it stands")
                return fn(conn)
        except sqlite3.DatabaseError as exc:
            if attempt == 2 or not _damaged(exc):
                raise
            log.warning("index_rebuilt", why=str(exc))
            _remove(db_path(home))
    raise AssertionError("unreachable")


def _read_in_memory(
    home: Home, fn: Callable[[sqlite3.Connection], T], only: Iterable[str] | None
) -> T:
    """``fn`` run on an index in memory brought up to date from the folders, nothing written
    to the disk: the index on disk copied first when it can be read (so only what changed
    since is read again), else every folder read. It holds what the index on disk would."""
    for copy in (True, False):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.create_function("unz", 1, _unz, deterministic=True)
        try:
            if copy:
                _copy_into(db_path(home), conn)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA:
                _migrate(conn, version, say=False)
            refresh(conn, home, only)
            return fn(conn)
        except sqlite3.DatabaseError:
            if not copy:
                raise  # the folders alone, and still an error: not the index's
        finally:
            conn.close()
    raise AssertionError("unreachable")


def _copy_into(path: Path, conn: sqlite3.Connection) -> None:
    """The database at ``path`` copied into ``conn``, read as a file that does not change
    (``immutable``: no lock and no shared memory, which a full disk has no room for; what its
    WAL holds is left out, and the refresh reads those folders again)."""
    if refusal(path) or not path.is_file() or path.stat().st_size == 0:
        return  # (a refused path is never read: a link may lead to any database)
    src = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
    try:
        src.backup(conn)
    finally:
        src.close()


def _stat_key(path: str) -> str:
    try:
        st = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return "-"
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _keys(folder: str, archived: bool) -> tuple[str, str]:
    """What the index records of a folder: its own inode and mtime, which every rename in it
    changes (the writer replaces state.json and metadata.json by rename, and a rotation makes a
    file), with where it lives; and its log's inode, size and mtime, which an append changes.
    Plain strings and two system calls: it runs for every folder."""
    return f"{int(archived)}|{_stat_key(folder)}", _stat_key(folder + "/messages.log")


def folders(home: Home, *, archived: bool = True) -> dict[str, tuple[str, bool]]:
    """Every conversation folder (``archived`` False: the active ones): id → (path, archived).
    An id in both places is the active one."""
    out: dict[str, tuple[str, bool]] = {}
    places = ((home.active, False), (home.completed, True))
    for d, is_archived in places if archived else places[:1]:
        try:
            with os.scandir(d) as it:
                for e in it:
                    if valid_id(e.name) and e.is_dir(follow_symlinks=False):
                        out.setdefault(e.name, (e.path, is_archived))
        except FileNotFoundError:
            continue
    return out


def _located(home: Home, only: Iterable[str]) -> dict[str, tuple[str, bool]]:
    out: dict[str, tuple[str, bool]] = {}
    for conv_id in only:
        for d, archived in ((home.active, False), (home.completed, True)):
            path = os.path.join(d, conv_id)
            if valid_id(conv_id) and os.path.isdir(path) and not os.path.islink(path):
                out[conv_id] = (path, archived)
                break
    return out


def refresh(conn: sqlite3.Connection, home: Home, only: Iterable[str] | None = None) -> int:
    """Bring the index up to date with the folders (all, or ``only`` these); how many
    conversations were read again. The folders are looked at before the write lock is taken;
    what the index holds is read under it, so two processes never index a folder twice.

    Archived folders are looked at one by one when ``completed/`` itself changed (an archive,
    a reopen, a prune, a folder restored into it) and at least every ``FULL_SWEEP_S`` seconds
    (a hand edit inside an archived folder); otherwise only the active ones are: two
    ``stat`` calls for each of 500 folders, not of 10,500."""
    ids = None if only is None else list(only)
    sweep = None
    if ids is None:
        sweep = _sweep_mark(home)
        full = _meta(conn, "sweep") != sweep
        found = folders(home, archived=full)
    else:
        full = True
        found = _located(home, ids)
    seen = {c: (_keys(path, archived), path, archived) for c, (path, archived) in found.items()}
    known = _known(conn, ids, archived=full)
    same = all(known.get(c) == keys for c, (keys, _, _) in seen.items())
    if same and set(known) <= set(seen):
        if sweep is not None and full:
            _set_meta(conn, "sweep", sweep)
        return 0  # nothing changed: no write lock taken (but for the sweep's mark)
    _say_if_long(sum(1 for c, (keys, _, _) in seen.items() if known.get(c) != keys))
    conn.execute("BEGIN IMMEDIATE")
    changed = 0
    try:
        known = _known(conn, ids, archived=full)
        for gone in set(known) - set(seen):
            _forget(conn, gone)
            conn.execute("DELETE FROM convs WHERE id = ?", (gone,))
            # a folder removed by hand: its sums go with it (else the ledger counts it forever)
            conn.execute("DELETE FROM ledger WHERE conv = ?", (gone,))
            conn.execute("DELETE FROM ladder WHERE conv = ?", (gone,))
        for conv_id, (keys, path, archived) in seen.items():
            was = known.get(conv_id)
            if was == keys:
                continue
            _refresh_one(conn, Conv(Path(path)), archived, keys, was)
            changed += 1
            if changed % BATCH == 0:  # let readers and other writers in between
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
        if sweep is not None and full:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('sweep', ?)", (sweep,))
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return changed


def _refresh_one(
    conn: sqlite3.Connection,
    conv: Conv,
    archived: bool,
    keys: tuple[str, str],
    was: tuple[str, str] | None,
) -> None:
    """One folder's row (and text) brought up to date. A folder whose files make it fail
    gets a row that says what is wrong (read again when it changes), not a failed refresh:
    its files are anyone's. The index's own errors (SQLite's) are raised."""
    try:
        if was is not None and was[1] == keys[1]:
            _update_row(conn, conv, archived, keys)
        elif not (was and _grew(was[1], keys[1]) and _append(conn, conv, archived, keys)):
            _index(conn, conv, archived, keys)
    except sqlite3.Error:
        raise
    except Exception as exc:  # a folder's content must not break every list
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        log.warning("index_row_unreadable", conv=conv.id, why=why)
        _put_row(conn, conv, archived, keys=keys, meta={}, facts=Facts(), problem=why, state={})


def _say_if_long(stale: int) -> None:
    """The first command after an upgrade or a restore reads every folder: say why it waits."""
    if stale >= NOTICE_AT:
        log.info("index_building", conversations=stale)
        if sys.stderr.isatty():
            sys.stderr.write(f"indexing {stale} conversations (once; kept current after)\n")


def _sweep_mark(home: Home) -> str:
    """``completed/``'s own inode and mtime (taken before its folders are), and the current
    ``FULL_SWEEP_S`` window: when either differs from the last full sweep's, sweep again."""
    return f"{_stat_key(str(home.completed))}|{int(time.time() // FULL_SWEEP_S)}"


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    got = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return str(got[0]) if got else None


def _set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def _known(
    conn: sqlite3.Connection, ids: list[str] | None, *, archived: bool = True
) -> dict[str, tuple[str, str]]:
    if ids is not None:
        marks = ",".join("?" * len(ids))
        rows = conn.execute(
            f"SELECT id, key, log_key FROM convs WHERE id IN ({marks})", ids
        ).fetchall()
    elif archived:
        rows = conn.execute("SELECT id, key, log_key FROM convs").fetchall()
    else:
        rows = conn.execute("SELECT id, key, log_key FROM convs WHERE archived = 0").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def drift(home: Home) -> dict[str, list[str]]:
    """What the index does not know yet, without writing: conversations it lacks, holds
    though they are gone, or recorded before they changed."""
    found = folders(home)
    with _full_disk_said(home), opened(home) as conn:
        known = _known(conn, None)
    return {
        "missing": sorted(set(found) - set(known)),
        "gone": sorted(set(known) - set(found)),
        "changed": sorted(
            c for c, (path, arch) in found.items() if c in known and known[c] != _keys(path, arch)
        ),
    }


def rebuild(home: Home, progress: Callable[[int, int], None] | None = None) -> int:
    """The index made anew from the folders (``progress(done, total)`` as it goes); how many
    conversations it holds. Its tables are emptied in one transaction, not its file removed:
    a rebuild the disk has no room for leaves the index as it was (only a damaged file is
    removed)."""
    with _full_disk_said(home):
        try:
            return _rebuild(home, progress)
        except sqlite3.DatabaseError as exc:
            if not _damaged(exc):
                raise
            log.warning("index_rebuilt", why=str(exc))
            _remove(db_path(home))
            return _rebuild(home, progress)


def _rebuild(home: Home, progress: Callable[[int, int], None] | None) -> int:
    found = sorted(folders(home).items())
    with opened(home) as conn:
        conn.execute("PRAGMA synchronous=OFF")  # derived: a crash mid-rebuild is a rebuild
        conn.execute("BEGIN IMMEDIATE")
        try:
            _make_tables(conn)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        if progress is not None:
            progress(0, len(found))
        for start in range(0, len(found), BATCH):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for conv_id, (path, archived) in found[start : start + BATCH]:
                    if conn.execute("SELECT 1 FROM convs WHERE id = ?", (conv_id,)).fetchone():
                        continue  # another process indexed it meanwhile
                    _index(conn, Conv(Path(path)), archived, _keys(path, archived))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            if progress is not None:
                progress(min(start + BATCH, len(found)), len(found))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL back to nothing
    return len(found)


def forget(home: Home, ids: Iterable[str]) -> None:
    """Drop conversations' rows now (``prune`` removed their folders); nothing to do for an
    index that is refused (it is not read either)."""
    if refusal(db_path(home)):
        return
    with _full_disk_said(home), opened(home) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for conv_id in ids:
                _forget(conn, conv_id)
                conn.execute("DELETE FROM convs WHERE id = ?", (conv_id,))
                conn.execute("DELETE FROM ledger WHERE conv = ?", (conv_id,))
                conn.execute("DELETE FROM ladder WHERE conv = ?", (conv_id,))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise


# conv, number, sender, time, offset, text, thinking, and the two compressed
_Block = tuple[str, int, str, str, int, str, str, bytes | None, bytes | None, bool]


def _folder_meta(conv: Conv) -> tuple[dict[str, Any], str]:
    """metadata.json as plain JSON (a few fields, no model to build), and what is wrong
    with it ("": nothing, or missing: a folder made by hand)."""
    meta, why = read_json_why(conv.metadata)
    return meta or {}, why


def _rows(conv_id: str, blocks: Iterable[Block], n: int, base: int) -> list[_Block]:
    """Blocks as rows: numbered on from ``n``, ``base`` added to their file's offsets (the
    cursor of the file's first byte)."""
    from contemplation.store.cursors import own_block

    out: list[_Block] = []
    for b in blocks:
        body = _said(b.text)
        n += 1
        row = (conv_id, n, b.sender, b.timestamp, base + b.offset, body, b.thinking)
        out.append((*row, _z(body), _z(b.thinking), own_block(b)))
    return out


# logstream's error for a block read by its first bytes: where, how long, how much was kept
_CUT_NOTE = re.compile(r"the block at byte (\d+) is (\d+) bytes: only its first (\d+) were")


def _indexed(
    conn: sqlite3.Connection,
    conv: Conv,
    fd: int,
    *,
    label: str,
    n: int,
    base: int,
    start: int = 0,
) -> tuple[int, int]:
    """One file of the log (open at ``fd``) from byte ``start`` into the index, a stretch of
    blocks at a time (:mod:`contemplation.store.logstream`: a file of any size costs a bounded
    amount of memory; a block past its bound is indexed by its first bytes, said in a log
    line); its blocks numbered on from ``n`` at cursor ``base``. The number of the last
    block, and the bytes read."""
    from contemplation.store import logstream

    size = 0
    for part in logstream.stream(fd, agent_label=label, start=start):
        rows = _rows(conv.id, part.blocks, n, base)
        _insert(conn, rows)
        n += len(rows)
        size += part.size
        for note in logstream.cut_notes(part.errors):
            log.warning("index_block_cut", conv=conv.id, why=note)
            if (m := _CUT_NOTE.search(note)) is not None:
                at, whole, kept = (int(g) for g in m.groups())
                conn.execute(
                    "INSERT INTO cut VALUES (?, ?, ?, ?)", (conv.id, base + at, whole, kept)
                )
    return n, size


def _index(conn: sqlite3.Connection, conv: Conv, archived: bool, keys: tuple[str, str]) -> None:
    """A conversation's text and row, read from its folder file by file, a stretch of blocks
    at a time: however long its log, nothing of it is skipped and little is held."""
    from contemplation.store.logview import log_segments

    meta, problem = _folder_meta(conv)
    label = str(meta.get("agent_label") or "CLAUDE")
    _forget(conn, conv.id)
    n = size = 0
    for seg in log_segments(conv):
        try:  # never through a link, never a FIFO
            fd, st = open_regular_stat(seg)
        except (OSError, InputRejected) as exc:
            log.warning("index_skipped", conv=conv.id, file=seg.name, why=str(exc))
            continue
        try:
            n, read = _indexed(conn, conv, fd, label=label, n=n, base=size)
        except OSError as exc:  # a read that failed half way: what was read stays indexed
            log.warning("index_skipped", conv=conv.id, file=seg.name, why=str(exc))
            read = st.st_size
        finally:
            os.close(fd)
        size += read
    crashpoint("index_write")
    count, agent, own, last = _counted(conn, conv.id, label)
    facts = Facts(count, own, count - agent, header_ts(last), size)
    _put_row(conn, conv, archived, keys=keys, meta=meta, facts=facts, problem=problem)


def _counted(conn: sqlite3.Connection, conv_id: str, label: str) -> tuple[int, int, int, str]:
    """The conversation's blocks in the index: how many, how many under the agent's label,
    how many the agent's own (its messages and its own answers, not a tool's), and the time
    of the last one."""
    count, agent, own, last = conn.execute(
        "SELECT count(*), coalesce(sum(sender = ?), 0), coalesce(sum(own), 0), "
        "(SELECT time FROM blocks WHERE conv = ? ORDER BY at DESC LIMIT 1) "
        "FROM blocks WHERE conv = ?",
        (label, conv_id, conv_id),
    ).fetchone()
    return int(count), int(agent), int(own), str(last or "")


def _insert(conn: sqlite3.Connection, blocks: list[_Block]) -> None:
    """Blocks into the table and their terms into FTS5: ids taken under the write lock, two
    batched inserts rather than two per block."""
    if not blocks:
        return
    first = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM blocks").fetchone()[0]
    conn.executemany(
        "INSERT INTO blocks (id, conv, block, sender, time, at, own, zbody, zthinking) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(first + i, *b[:5], b[9], b[7], b[8]) for i, b in enumerate(blocks)],
    )
    conn.executemany(
        "INSERT INTO text (rowid, body, thinking) VALUES (?, ?, ?)",
        [(first + i, b[5], b[6]) for i, b in enumerate(blocks)],
    )


def _grew(old: str, new: str) -> bool:
    """The same log file, longer: what an append (a block, a reply streamed) leaves."""
    if old == "-" or new == "-":
        return False
    old_ino, old_size, _ = old.split(":")
    new_ino, new_size, _ = new.split(":")
    return old_ino == new_ino and int(new_size) > int(old_size)


def _append(conn: sqlite3.Connection, conv: Conv, archived: bool, keys: tuple[str, str]) -> bool:
    """Index only what was appended to the live log: its last indexed block (a reply may have
    been growing) and the blocks after it. False when that cannot be done (the bytes where the
    last block was are not a header any more: the log was rewritten), for a full index."""
    from contemplation.protocol.logformat import FRAME_OPEN
    from contemplation.store.logview import log_segments

    segs = log_segments(conv)
    if not segs or segs[-1] != conv.log:
        return False
    try:
        live_start = sum(os.stat(p, follow_symlinks=False).st_size for p in segs[:-1])
        fd, st = open_regular_stat(conv.log)
    except (OSError, InputRejected):
        return False
    try:
        tail = conn.execute("SELECT max(at) FROM blocks WHERE conv = ?", (conv.id,)).fetchone()[0]
        start = max(int(tail if tail is not None else 0), live_start)
        opening = os.pread(fd, len(FRAME_OPEN), start - live_start)
        if opening and opening != FRAME_OPEN.encode():
            return False
        meta, problem = _folder_meta(conv)
        label = str(meta.get("agent_label") or "CLAUDE")
        conn.execute(
            "INSERT INTO text (text, rowid, body, thinking) SELECT 'delete', id, unz(zbody), "
            "unz(zthinking) FROM blocks WHERE conv = ? AND at >= ?",
            (conv.id, start),
        )
        conn.execute("DELETE FROM blocks WHERE conv = ? AND at >= ?", (conv.id, start))
        conn.execute("DELETE FROM cut WHERE conv = ? AND at >= ?", (conv.id, start))
        kept = conn.execute("SELECT count(*) FROM blocks WHERE conv = ?", (conv.id,)).fetchone()
        _indexed(conn, conv, fd, label=label, n=kept[0], base=live_start, start=start - live_start)
    finally:
        os.close(fd)
    crashpoint("index_write")
    count, agent, own, last = _counted(conn, conv.id, label)
    facts = Facts(count, own, count - agent, header_ts(last), live_start + st.st_size)
    _put_row(conn, conv, archived, keys=keys, meta=meta, facts=facts, problem=problem)
    return True


def _update_row(
    conn: sqlite3.Connection, conv: Conv, archived: bool, keys: tuple[str, str]
) -> None:
    got = conn.execute(
        "SELECT blocks, agent_msgs, model_turns, log_ts, bytes FROM convs WHERE id = ?",
        (conv.id,),
    ).fetchone()
    facts = Facts(*got) if got else Facts()
    meta, problem = _folder_meta(conv)
    _put_row(conn, conv, archived, keys=keys, meta=meta, facts=facts, problem=problem)


def _unstated(conn: sqlite3.Connection, conv_id: str, meta: dict[str, Any]) -> str:
    """The status of a folder no daemon has written a state for: idle when the model spoke
    last (the next word is the agent's, as the daemon would say), else pending."""
    got = conn.execute(
        "SELECT sender FROM blocks WHERE conv = ? ORDER BY at DESC LIMIT 1", (conv_id,)
    ).fetchone()
    label = str(meta.get("agent_label") or "CLAUDE")
    return "idle" if got is not None and got[0] != label else "pending"


def _put_row(
    conn: sqlite3.Connection,
    conv: Conv,
    archived: bool,
    *,
    keys: tuple[str, str],
    meta: dict[str, Any],
    facts: Facts,
    problem: str = "",
    state: dict[str, Any] | None = None,
) -> None:
    """``problem``: what is wrong with the folder (metadata.json, or what made it fail),
    with what is wrong with its state.json joined to it; ``state``: instead of reading it."""
    if state is None:
        got, why = read_json_why(conv.state)
        state, problem = got or {}, "; ".join(w for w in (problem, why) if w)
    if not problem and "status" not in state:  # made by hand or imported: the log says
        state = {**state, "status": _unstated(conn, conv.id, meta)}
    row = summary_row(conv, archived, meta, state, facts, problem)
    turn = state.get("last_turn")
    usage: dict[str, Any] = turn if isinstance(turn, dict) else {}
    _put_ledger(conn, conv.id, archived, state.get("ledger"))
    _put_ladder(conn, conv.id, archived, state.get("ladder"))
    conn.execute(
        "INSERT OR REPLACE INTO convs VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            conv.id,
            int(archived),
            row["topic"],
            row["model"],
            row["backend"],
            row["template"],
            row["status"],
            row["created"],
            row["last_activity_ts"],
            facts.blocks,
            facts.agent_msgs,
            facts.model_turns,
            as_int(usage.get("prompt_eval_count")),
            as_int(usage.get("eval_count")),
            facts.bytes,
            disk_use(str(conv.dir)),
            facts.log_ts,
            " ".join(str(row[k]) for k in ("id", "topic", "model", "backend", "status")).casefold(),
            str(row["topic"]).casefold(),
            json.dumps(row, ensure_ascii=False),
            keys[0],
            keys[1],
        ),
    )


def _put_ledger(conn: sqlite3.Connection, conv_id: str, archived: bool, raw: Any) -> None:
    """The conversation's ledger rows (one per provider/model) from state.json's ``ledger``;
    a value that is none is left out (a hand edit cannot stop the index)."""
    from pydantic import ValidationError

    from contemplation.models import LedgerSums
    from contemplation.protocol.ledger import FIELDS as LEDGER_COLUMNS

    conn.execute("DELETE FROM ledger WHERE conv = ?", (conv_id,))
    by = raw.get("by") if isinstance(raw, dict) else None
    rows = []
    for key, sums in (by if isinstance(by, dict) else {}).items():
        try:
            got = LedgerSums.model_validate(sums)
        except ValidationError:
            continue
        provider, _, model = str(key).partition("/")
        figures = [getattr(got, c) for c in LEDGER_COLUMNS]
        rows.append((conv_id, int(archived), provider, model, got.turns, *figures,
                     got.context_bytes))  # fmt: skip
    conn.executemany(
        f"INSERT INTO ledger VALUES ({', '.join('?' * (len(LEDGER_COLUMNS) + 6))})", rows
    )


LADDER_RUNGS_KEPT = 100  # rows a conversation's book gives the index; past it, under "other"


def _put_ladder(conn: sqlite3.Connection, conv_id: str, archived: bool, raw: Any) -> None:
    """The conversation's escalation book (state.json's ``ladder``) as rows: one per rung
    that answered (the first LADDER_RUNGS_KEPT; the rest summed under "other") and one with
    its other figures; none for a conversation without a ladder or a book that is not one."""
    from pydantic import ValidationError

    from contemplation.models import LadderBook

    conn.execute("DELETE FROM ladder WHERE conv = ?", (conv_id,))
    if not isinstance(raw, dict):
        return
    try:
        book = LadderBook.model_validate(raw)
    except ValidationError:
        return  # a hand edit cannot stop the index
    answered: dict[str, int] = {}
    for rung, n in book.answered.items():
        key = rung if rung in answered or len(answered) < LADDER_RUNGS_KEPT else "other"
        answered[key] = answered.get(key, 0) + max(0, n)
    rows: list[tuple[str, int, str | None, int, int, int, int]] = [
        (conv_id, int(archived), rung, n, 0, 0, 0) for rung, n in answered.items()
    ]
    rows.append((conv_id, int(archived), None, 0, max(0, book.escalated),
                 max(0, book.to_agent), max(0, book.saved_tokens_estimate)))  # fmt: skip
    conn.executemany("INSERT INTO ladder VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def _z(text: str) -> bytes | None:
    return zlib.compress(text.encode(), 1) if text else None


def _unz(data: bytes | None) -> str:
    return zlib.decompress(data).decode() if data else ""


def _said(text: str) -> str:
    """A block's text without the tool output's framing lines (what was said, not how)."""
    from contemplation.protocol.logformat import TOOL_OUTPUT_BEGIN, TOOL_OUTPUT_END

    if TOOL_OUTPUT_BEGIN not in text:
        return text
    return "\n".join(
        ln
        for ln in text.split("\n")
        if not ln.startswith(TOOL_OUTPUT_BEGIN) and ln != TOOL_OUTPUT_END
    )


def _forget(conn: sqlite3.Connection, conv_id: str) -> None:
    # an external-content FTS5 table forgets a row's terms when told what they were
    conn.execute(
        "INSERT INTO text (text, rowid, body, thinking) "
        "SELECT 'delete', id, unz(zbody), unz(zthinking) FROM blocks WHERE conv = ?",
        (conv_id,),
    )
    conn.execute("DELETE FROM blocks WHERE conv = ?", (conv_id,))
    conn.execute("DELETE FROM cut WHERE conv = ?", (conv_id,))
