"""``Brain memory about <topic>``: a small durable key/value store with search.

The store is one JSON file under the home (``memory.json``; ``current-state.json`` for the
state tool), in the format docs/reference/format.md describes::

    {"version": 1, "entries": {"query patterns": {"value": "…", "updated": "…", "tags": []}}}

Reads take the file as it is (a write replaces it whole, so a reader never sees half a file)
and are cached on its identity (inode, size, mtime). A file that is not that format is an
error naming the file and what is wrong — never an empty store — and nothing is written over
it. Writes are read-modify-replace under ``flock(<home>/.<file>.lock)`` through
:func:`contemplation.writer.atomic_write_json`, so two processes adding at once both keep
their entry. To use an MCP memory server instead, route the need there with a rule, e.g.
``[[routes]] prefix = "Brain memory about"  tool = "memory:search_nodes"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contemplation.errors import InputRejected, ToolError
from contemplation.needs.tools.base import ToolResult, text_arg
from contemplation.needs.tools.notes import terms
from contemplation.store.layout import Home
from contemplation.writer import atomic_write_json, ensure_home

MEMORY_FILE = "memory.json"
STATE_FILE = "current-state.json"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024
ENTRY_FIELDS = ("value", "updated", "tags")


class StoreError(ToolError):
    """A store file that cannot be read as a store: names the file and the problem."""


class BadFormat(ValueError):
    """What is wrong with a store file's content (:func:`parse_store`)."""


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: str
    updated: str
    tags: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "updated": self.updated, "tags": [*self.tags]}


def norm_key(key: str) -> str:
    return " ".join(key.casefold().split())


def _entry(key: Any, item: Any) -> Entry | str:
    """One entry of the file, or what is wrong with it."""
    if not isinstance(key, str) or not norm_key(key):
        return "an entry has an empty key"
    if isinstance(item, str):
        return Entry(key, item, "")
    if not isinstance(item, dict):
        return f"entry {key!r} must be an object or a string, not {type(item).__name__}"
    unknown = sorted(set(item) - set(ENTRY_FIELDS))
    if unknown:
        return f"entry {key!r} has an unknown field {unknown[0]!r} (known: value, updated, tags)"
    value, updated, tags = item.get("value"), item.get("updated", ""), item.get("tags", [])
    if not isinstance(value, str):
        return f"entry {key!r} needs a string 'value'"
    if not isinstance(updated, str):
        return f"entry {key!r}: 'updated' must be a string"
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        return f"entry {key!r}: 'tags' must be a list of strings"
    return Entry(key, value, updated, tuple(tags))


def parse_store(data: bytes) -> dict[str, Entry]:
    """The entries of a store file by normalised key; raises BadFormat saying what is wrong."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadFormat("not UTF-8 text") from None
    except ValueError as exc:
        raise BadFormat(f"not JSON ({exc})") from None
    except RecursionError:
        raise BadFormat("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadFormat(f'must be a JSON object {{"version", "entries"}}, not {_kind(doc)}')
    unknown = sorted(set(doc) - {"version", "entries"})
    if unknown:
        raise BadFormat(f"unknown key {unknown[0]!r} (known: version, entries)")
    version = doc.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise BadFormat(f"format version {version!r}; this contemplation reads {FORMAT_VERSION}")
    raw = doc.get("entries")
    if not isinstance(raw, dict):
        raise BadFormat(f'"entries" must be an object (key → entry), not {_kind(raw)}')
    entries: dict[str, Entry] = {}
    for key, item in raw.items():
        entry = _entry(key, item)
        if isinstance(entry, str):
            raise BadFormat(entry)
        same = entries.get(norm_key(key))
        if same is not None:
            raise BadFormat(
                f"keys {same.key!r} and {key!r} are the same key (case and spacing are ignored)"
            )
        entries[norm_key(key)] = entry
    return entries


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


class JsonStore:
    """Key → text, with search. Writes are serialised across threads and processes."""

    def __init__(
        self,
        home: Home,
        filename: str,
        *,
        durable: bool = True,
        max_entries: int = 10_000,
        max_value_chars: int = 20_000,
        max_key_chars: int = 200,
        max_tags: int = 20,
    ) -> None:
        self.home = home
        self.path = home.root / filename
        self.lock_path = home.root / f".{filename}.lock"
        self.durable = durable
        self.max_entries = max_entries
        self.max_value_chars = max_value_chars
        self.max_key_chars = max_key_chars
        self.max_tags = max_tags
        self._lock = threading.Lock()
        self._cache: tuple[tuple[int, int, int], dict[str, Entry]] | None = None

    # -- reading ----------------------------------------------------------------------

    def load(self) -> dict[str, Entry]:
        """All entries by normalised key (empty when the file does not exist yet); a file
        that is no store raises :class:`StoreError` naming it and the problem."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._cache
        if cached is not None and cached[0] == stamp:
            return cached[1]
        entries = self._read()
        self._cache = (stamp, entries)
        return entries

    def _read(self) -> dict[str, Entry]:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE_BYTES:
            raise StoreError(f"cannot read {self.path}: larger than {MAX_FILE_BYTES:,} bytes")
        try:
            return parse_store(data)
        except BadFormat as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from None

    def get(self, key: str) -> Entry | None:
        return self.load().get(norm_key(key))

    def entries(self) -> list[Entry]:
        """Every entry, by key."""
        return sorted(self.load().values(), key=lambda e: norm_key(e.key))

    def search(self, query: str, limit: int = 5) -> list[tuple[float, Entry]]:
        q = set(terms(query))
        phrase = norm_key(query)
        scored: list[tuple[float, Entry]] = []
        for e in self.load().values():
            key_terms = set(terms(e.key + " " + " ".join(e.tags)))
            value_terms = terms(e.value)
            score = 3.0 * len(q & key_terms) + sum(1 for t in value_terms if t in q) / (
                1 + len(value_terms) / 50
            )
            if phrase and phrase in norm_key(e.key):
                score += 5.0
            if score > 0:
                scored.append((score, e))
        scored.sort(key=lambda s: (-s[0], norm_key(s[1].key)))
        return scored[: max(0, limit)]

    # -- writing ----------------------------------------------------------------------

    def put(self, key: str, value: str, *, tags: Sequence[str] = ()) -> Entry:
        return self.add(key, value, tags=tags)[0]

    def add(self, key: str, value: str, *, tags: Sequence[str] = ()) -> tuple[Entry, Entry | None]:
        """Set ``key`` to ``value``; returns the new entry and the one it replaced. Refuses
        (:class:`InputRejected`) an empty or long key, an empty or long value, too many tags, and a
        new key in a full store: nothing already stored is ever dropped."""
        entry = self._checked(key, value, tags)
        with self._locked():
            entries = self._read()
            before = entries.get(norm_key(key))
            if before is None and len(entries) >= self.max_entries:
                raise InputRejected(
                    f"{self.path} holds {len(entries):,} entries, the limit; remove some first"
                )
            entries[norm_key(key)] = entry
            self._save(entries)
        return entry, before

    def delete(self, key: str) -> bool:
        with self._locked():
            entries = self._read()
            if entries.pop(norm_key(key), None) is None:
                return False
            self._save(entries)
        return True

    def _checked(self, key: str, value: str, tags: Sequence[str]) -> Entry:
        name = " ".join(key.split())  # kept as written, but for the spacing
        if not norm_key(name):
            raise InputRejected("an entry needs a key")
        if len(name) > self.max_key_chars:
            raise InputRejected(f"the key is {len(name)} characters; at most {self.max_key_chars}")
        if not value.strip():
            raise InputRejected(f"the value for {name!r} is empty")
        if len(value) > self.max_value_chars:
            raise InputRejected(
                f"the value is {len(value):,} characters; at most {self.max_value_chars:,}"
            )
        clean = tuple(dict.fromkeys(t.strip() for t in tags if t.strip()))
        if len(clean) > self.max_tags:
            raise InputRejected(f"{len(clean)} tags; at most {self.max_tags}")
        return Entry(name, value, time.strftime("%Y-%m-%dT%H:%M:%S%z"), clean)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This store's write lock: a thread lock, and ``flock`` on the lock file for other
        processes (held from the read to the rename)."""
        with self._lock:
            ensure_home(self.home)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing the descriptor releases the lock

    def _save(self, entries: Mapping[str, Entry]) -> None:
        doc = {
            "version": FORMAT_VERSION,
            "entries": {
                e.key: {"value": e.value, "updated": e.updated, "tags": list(e.tags)}
                for e in sorted(entries.values(), key=lambda e: norm_key(e.key))
            },
        }
        atomic_write_json(self.path, doc, durable=self.durable)
        self._cache = None


def _line(e: Entry) -> str:
    when = f" (updated {e.updated})" if e.updated else ""
    return f"- {e.key}{when}: {e.value}"


class MemorySearch:
    name = "memory.search"

    def __init__(self, store: JsonStore, *, results: int = 5) -> None:
        self.store = store
        self.results = results

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        query = text_arg(arguments, "query")
        return await asyncio.to_thread(self.answer, query)

    def answer(self, query: str) -> ToolResult:
        hits = self.store.search(query, self.results + 1)
        src = str(self.store.path)
        if not hits:
            total = len(self.store.load())
            return ToolResult(f"nothing in memory about {query!r} ({total} entries)", src)
        shown = hits[: self.results]
        text = "\n".join(_line(e) for _, e in shown)
        return ToolResult(text, src, more=len(hits) > len(shown))
