"""The durable map of slot files: which file of a server holds which conversation's prompt.

llama-server started with ``--slot-save-path`` keeps a slot's KV cache in a file that outlives
the server and the daemon (:mod:`contemplation.engine.kvfiles` is the daemon's pool of
them). This map is what outlives the daemon: per provider, the model the files were made by
and, least recently used first, each conversation's file (its name, the tokens it holds,
the prompt tokens and the messages' hashes of the turn it was saved after, its size), and
the conversations whose file was given up (``evicted``: their next turn's miss is named
so). Written whole through the writer (a temp file, fsync, rename; owner-only), off the
event loop, by the one daemon that holds the home; a command that makes conversations go
while no daemon runs (``archive``, ``prune``) only reads it, to remove their files
(:func:`.slotfiles.drop_gone`).

A file's name is random (``contemplation-kv-<24 hex>.bin``): it says nothing of the
conversation, and a name in the map was made by this daemon, never read from a request.
Entries of conversations no longer in ``active/`` (archived, deleted, pruned) are dropped when
the map is read and each time it is written: their names are written over by the next save,
and where the provider names the server's folder (``slot_save_path``) their files are
removed from it (``Saved.gone``, see ``KvFiles``).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from contemplation.store.layout import Home
from contemplation.writer.files import atomic_write_bytes

log = structlog.get_logger("contemplation.kv")

FILE = "kvfiles.json"  # in the home
VERSION = 1
EVICTED_KEPT = 1024  # conversations remembered per provider as having had their file evicted
NAME = re.compile(r"^contemplation-kv-[0-9a-f]{24}\.bin$")
MODE = 0o600
_lock = threading.Lock()  # one read-modify-write of the file at a time (providers share it)
_last: dict[tuple[Path, str], int] = {}  # (home, provider) -> the newest snapshot written
_snapshots = itertools.count(1)  # numbers the snapshots of every pool of this process


def snapshot() -> int:
    """A new snapshot's number (greater than any before it in this process)."""
    return next(_snapshots)


@dataclass(frozen=True, slots=True)
class Entry:
    conv: str
    name: str
    tokens: int
    history: int
    size: int
    said: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Saved:
    """One provider's part of the map."""

    model: str = ""  # the server's model the files were made by ("": none yet)
    entries: tuple[Entry, ...] = ()  # least recently used first
    evicted: tuple[str, ...] = ()  # conversations whose file was given up, oldest first
    free: tuple[str, ...] = ()  # names given up, to be written over
    gone: tuple[str, ...] = ()  # of those, the names of conversations gone from active/


def path_in(home: Path) -> Path:
    return home / FILE


def _conv_gone(home: Path, key: str) -> bool:
    """``key`` (a conversation's id, or ``id#seat``) names no conversation in ``active/``."""
    conv_id = key.split("#", 1)[0]
    return not conv_id or "/" in conv_id or not (Home(home).active / conv_id).is_dir()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # unreadable: the files are made anew
        log.warning("kv_map_unreadable", path=str(path), error=str(exc))
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return {}
    providers = data.get("providers")
    return providers if isinstance(providers, dict) else {}


def _entry(raw: Any) -> Entry | None:
    if not isinstance(raw, dict):
        return None
    name, conv = raw.get("name"), raw.get("conv")
    nums = [raw.get(k) for k in ("tokens", "history", "size")]
    said = raw.get("said")
    if not (isinstance(name, str) and NAME.match(name) and isinstance(conv, str)):
        return None  # a name this daemon did not make is never sent to the server
    if not all(isinstance(n, int) and n >= 0 for n in nums) or not isinstance(said, list):
        return None
    if not all(isinstance(h, int) for h in said):
        return None
    tokens, history, size = (int(n) for n in nums)  # type: ignore[arg-type]
    return Entry(conv, name, tokens, history, size, tuple(said))


def load(home: Path, provider: str) -> Saved:
    """``provider``'s part of the map; entries of conversations gone from ``active/`` are
    left out (their names are free to be written over)."""
    with _lock:
        raw = _read(path_in(home)).get(provider)
    if not isinstance(raw, dict):
        return Saved()
    entries: list[Entry] = []
    free = [n for n in raw.get("free") or [] if isinstance(n, str) and NAME.match(n)]
    gone: list[str] = []
    for item in raw.get("entries") or []:
        got = _entry(item)
        if got is None:
            continue
        if _conv_gone(home, got.conv):
            free.append(got.name)
            gone.append(got.name)
        else:
            entries.append(got)
    evicted = [c for c in raw.get("evicted") or [] if isinstance(c, str)][-EVICTED_KEPT:]
    model = raw.get("model")
    return Saved(
        model if isinstance(model, str) else "",
        tuple(entries),
        tuple(evicted),
        tuple(free),
        tuple(gone),
    )


def store(home: Path, provider: str, saved: Saved, seq: int = 0) -> Saved:
    """Write ``provider``'s part of the map (the others' as they are), durably. Returns what
    was written: ``saved`` less the entries of conversations gone meanwhile (their names
    freed). ``seq``: the snapshot's number; an older one than the last written is not
    written (two writes on two threads may end in either order). Blocking: called off the
    event loop."""
    entries = [e for e in saved.entries if not _conv_gone(home, e.conv)]
    gone = [e.name for e in saved.entries if _conv_gone(home, e.conv)]
    written = Saved(
        saved.model,
        tuple(entries),
        saved.evicted[-EVICTED_KEPT:],
        (*saved.free, *gone),
        tuple(gone),
    )
    part = {
        "model": written.model,
        "entries": [
            {"conv": e.conv, "name": e.name, "tokens": e.tokens, "history": e.history,
             "size": e.size, "said": list(e.said)}
            for e in written.entries
        ],
        "evicted": list(written.evicted),
        "free": list(written.free),
    }  # fmt: skip
    path = path_in(home)
    with _lock:
        if seq and _last.get((home, provider), 0) > seq:
            return written
        _last[(home, provider)] = seq
        providers = _read(path)
        providers[provider] = part
        data = {"version": VERSION, "providers": providers}
        atomic_write_bytes(path, (json.dumps(data) + "\n").encode(), durable=True, mode=MODE)
    return written
