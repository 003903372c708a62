"""``Brain memory about <topic>``: a small durable key/value store with search.

The store is one JSON file under the home (``memory.json``; ``current-state.json`` for the
state tool), replaced atomically through :func:`contemplation.writer.atomic_write_json`, so
a reader never sees half a file and a person can read or edit it. Reads are cached on the
file's size and mtime. To use an MCP memory server instead, route the need there with a rule,
e.g. ``[[routes]] prefix = "Brain memory about"  tool = "memory:search_nodes"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contemplation.errors import ToolError
from contemplation.layout import Home
from contemplation.tools.base import ToolResult, text_arg
from contemplation.tools.notes import terms
from contemplation.writer import atomic_write_json, ensure_home

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: str
    updated: str
    tags: tuple[str, ...] = ()


def norm_key(key: str) -> str:
    return " ".join(key.casefold().split())


class JsonStore:
    """Key → text, with search. Thread-safe in one process; across processes the last write wins."""

    def __init__(
        self,
        home: Home,
        filename: str,
        *,
        durable: bool = True,
        max_entries: int = 10_000,
        max_value_chars: int = 20_000,
    ) -> None:
        self.home = home
        self.path = home.root / filename
        self.durable = durable
        self.max_entries = max_entries
        self.max_value_chars = max_value_chars
        self._lock = threading.Lock()
        self._cache: tuple[tuple[int, int], dict[str, Entry]] | None = None

    def load(self) -> dict[str, Entry]:
        """All entries by normalised key (empty when the file does not exist yet)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        stamp = (st.st_size, st.st_mtime_ns)
        cached = self._cache
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ToolError(f"cannot read {self.path}: {exc}") from None
        raw = data.get("entries", {}) if isinstance(data, dict) else {}
        entries: dict[str, Entry] = {}
        for key, item in raw.items() if isinstance(raw, dict) else []:
            if isinstance(item, dict):
                value, updated = str(item.get("value", "")), str(item.get("updated", ""))
                tags = tuple(str(t) for t in item.get("tags", []) if isinstance(t, str))
            else:
                value, updated, tags = str(item), "", ()
            entries[norm_key(key)] = Entry(key, value, updated, tags)
        self._cache = (stamp, entries)
        return entries

    def get(self, key: str) -> Entry | None:
        return self.load().get(norm_key(key))

    def put(self, key: str, value: str, *, tags: Sequence[str] = ()) -> Entry:
        if not key.strip():
            raise ToolError("a memory entry needs a key")
        entry = Entry(
            key.strip(),
            value[: self.max_value_chars],
            time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            tuple(tags),
        )
        with self._lock:
            entries = dict(self.load())
            entries[norm_key(key)] = entry
            if len(entries) > self.max_entries:
                oldest = sorted(entries.values(), key=lambda e: e.updated)
                for e in oldest[: len(entries) - self.max_entries]:
                    entries.pop(norm_key(e.key), None)
            self._save(entries)
        return entry

    def delete(self, key: str) -> bool:
        with self._lock:
            entries = dict(self.load())
            if entries.pop(norm_key(key), None) is None:
                return False
            self._save(entries)
        return True

    def _save(self, entries: Mapping[str, Entry]) -> None:
        ensure_home(self.home)
        doc = {
            "version": FORMAT_VERSION,
            "entries": {
                e.key: {"value": e.value, "updated": e.updated, "tags": list(e.tags)}
                for e in sorted(entries.values(), key=lambda e: norm_key(e.key))
            },
        }
        atomic_write_json(self.path, doc, durable=self.durable)
        self._cache = None

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
        return scored[:limit]


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
