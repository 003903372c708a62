"""Deleting archived conversations past an age (``prune``, and the daemon once a day).

Only ``completed/`` is ever touched, by the writer (:func:`~contemplation.writer.delete_archived`):
a conversation is taken out of sight first (renamed to a dot-name no face lists, within
``completed/``) and then deleted, so a crash in between leaves
no half-deleted conversation behind: the next prune finishes what a crash left. Its index rows
go with it. Age is the conversation's last activity as the index knows it (the log's last
dated header for a folder made by hand).
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from contemplation.errors import InputRejected
from contemplation.index import db, rows
from contemplation.store.layout import Home
from contemplation.writer import delete_archived, finish_deletions

log = structlog.get_logger("contemplation.retention")

_AGE = re.compile(r"(\d+)\s*([dhw]?)")
_UNITS = {"": 86400, "d": 86400, "h": 3600, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``90d``, ``12h``, ``2w`` (a bare number is days) as seconds."""
    m = _AGE.fullmatch(text.strip().lower())
    if not m or int(m.group(1)) <= 0:
        raise InputRejected(f"not an age: {text!r} (write 90d, 12h or 2w)")
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass(slots=True)
class Pruned:
    removed: list[dict[str, Any]] = field(default_factory=list)  # id, last activity, bytes
    freed: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"removed": self.removed, "freed_bytes": self.freed, "dry_run": self.dry_run}


def prune(home: Home, older_than_s: float, *, dry_run: bool = False) -> Pruned:
    """Delete (or, dry, name) archived conversations whose last activity is older than
    ``older_than_s`` seconds ago."""
    cutoff = time.time() - older_than_s

    def old(conn: sqlite3.Connection) -> list[tuple[str, float, int]]:
        return conn.execute(
            "SELECT id, last_ts, disk FROM convs WHERE archived = 1 AND last_ts < ? "
            "ORDER BY last_ts",
            (cutoff,),
        ).fetchall()

    out = Pruned(dry_run=dry_run)
    if not dry_run:
        finish_deletions(home)
    found = db.read(home, old)
    deleted = set(delete_archived(home, [r[0] for r in found])) if not dry_run else set()
    for conv_id, last_ts, disk in found:
        if not dry_run and conv_id not in deleted:
            continue  # reopened or removed meanwhile
        out.removed.append({"id": conv_id, "last_activity": rows.clock(last_ts), "bytes": disk})
        out.freed += disk
    if out.removed and not dry_run:
        db.forget(home, [r["id"] for r in out.removed])
        log.info("pruned", conversations=len(out.removed), freed_bytes=out.freed)
    return out
