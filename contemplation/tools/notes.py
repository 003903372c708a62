"""``Obsidian notes matching <query>``: ranked full-text search over a folder of Markdown notes.

The vault is scanned (``*.md``, hidden folders such as ``.obsidian`` and ``.trash`` skipped,
symlinks that leave the vault ignored) and indexed in memory; a note is re-read only when
its size or mtime changes. Ranking is BM25 over the body plus a boosted title match (the
first ``# heading``, else the file name). Each hit comes back with its title, its path in the
vault and a snippet around the best-matching line.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import stat
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contemplation.errors import ToolError
from contemplation.tools.base import ToolResult, Unconfigured, text_arg

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
_TITLE_RE = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)
_STOP = "a an and are as at be by for from how in is it of on or that the this to was what when"
STOPWORDS = frozenset((_STOP + " where which who why with about into notes note matching").split())
K1, B, TITLE_BOOST = 1.4, 0.75, 2.5


def terms(text: str) -> list[str]:
    return [w for w in _WORD_RE.findall(text.casefold()) if len(w) > 1 and w not in STOPWORDS]


@dataclass(frozen=True, slots=True)
class _Note:
    rel: str
    title: str
    text: str
    tf: Counter[str]
    title_terms: frozenset[str]
    length: int
    key: tuple[int, int]  # (size, mtime_ns)
    partial: bool = False  # larger than max_note_bytes: only its head is searched


@dataclass(frozen=True, slots=True)
class Hit:
    title: str
    path: str
    score: float
    snippet: str


class NotesSearch:
    name = "notes.search"

    def __init__(
        self,
        vault: Path | None,
        *,
        max_notes: int = 20_000,
        max_note_bytes: int = 1024 * 1024,
        results: int = 5,
    ) -> None:
        self.vault = Path(vault).expanduser() if vault else None
        self.max_notes = max_notes
        self.max_note_bytes = max_note_bytes
        self.results = results
        self._index: dict[str, _Note] = {}
        self._lock = threading.Lock()
        self.skipped = 0

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        query = text_arg(arguments, "query")
        return await asyncio.to_thread(self.answer, query)

    def answer(self, query: str) -> ToolResult:
        hits, total = self.search(query)
        src = str(self.vault)
        if not hits:
            return ToolResult(
                f"no notes match {query!r} ({total} notes searched)", src, note=self._left_out()
            )
        lines = [f"{len(hits)} of the notes that match {query!r} ({total} notes searched):"]
        for i, h in enumerate(hits, 1):
            lines.append(f"{i}. {h.title} ({h.path})\n   {h.snippet}")
        return ToolResult("\n".join(lines), src, note=self._left_out())

    def _left_out(self) -> str:
        """What the search did not see whole: notes over the size bound (their first part was
        searched) and notes past the count bound (not searched)."""
        with self._lock:
            partial = sorted(n.rel for n in self._index.values() if n.partial)
            skipped = self.skipped
        said = []
        if partial:
            names = ", ".join(partial[:5]) + (
                f" and {len(partial) - 5} more" if len(partial) > 5 else ""
            )
            said.append(
                f"{len(partial)} note(s) over {self.max_note_bytes:,} bytes were searched in "
                f"their first {self.max_note_bytes:,} bytes only: {names}"
            )
        if skipped:
            said.append(f"{skipped:,} note(s) past the first {self.max_notes:,} were not searched")
        return "; ".join(said)

    # -- index ------------------------------------------------------------------------

    def _root(self) -> Path:
        if self.vault is None:
            raise Unconfigured("no notes vault is configured: set tools.notes_vault in the config")
        try:
            return self.vault.resolve(strict=True)
        except OSError:
            raise ToolError(f"the notes vault {self.vault} does not exist") from None

    def refresh(self) -> dict[str, _Note]:
        root = self._root()
        seen: dict[str, _Note] = {}
        skipped = 0
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if not name.lower().endswith(".md") or name.startswith("."):
                    continue
                if len(seen) >= self.max_notes:
                    skipped += 1
                    continue
                path = Path(dirpath) / name
                note = self._load(root, path)
                if note is not None:
                    seen[note.rel] = note
        with self._lock:
            self._index = seen
            self.skipped = skipped
        return seen

    def _load(self, root: Path, path: Path) -> _Note | None:
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                real = path.resolve(strict=True)
                if not real.is_relative_to(root):
                    return None  # a link out of the vault
                st = os.stat(real)
                path = real
            if not stat.S_ISREG(st.st_mode):
                return None
        except OSError:
            return None
        rel = path.relative_to(root).as_posix()
        key = (st.st_size, st.st_mtime_ns)
        old = self._index.get(rel)
        if old is not None and old.key == key:
            return old
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                text = f.read(self.max_note_bytes).decode("utf-8", errors="replace")
        except OSError:
            return None
        m = _TITLE_RE.search(text)
        title = m.group(1).strip() if m else path.stem
        words = terms(text)
        return _Note(
            rel,
            title,
            text,
            Counter(words),
            frozenset(terms(title + " " + path.stem)),
            len(words),
            key,
            st.st_size > self.max_note_bytes,
        )

    # -- search -----------------------------------------------------------------------

    def search(self, query: str) -> tuple[list[Hit], int]:
        notes = self.refresh()
        q = list(dict.fromkeys(terms(query)))
        if not q or not notes:
            return [], len(notes)
        n = len(notes)
        avg = sum(x.length for x in notes.values()) / n or 1.0
        df = {t: sum(1 for x in notes.values() if t in x.tf or t in x.title_terms) for t in q}
        scored: list[tuple[float, _Note]] = []
        for note in notes.values():
            score = 0.0
            for t in q:
                if not df[t]:
                    continue
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                f = note.tf.get(t, 0)
                if f:
                    score += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * note.length / avg))
                if t in note.title_terms:
                    score += idf * TITLE_BOOST
            if score > 0:
                scored.append((score, note))
        scored.sort(key=lambda s: (-s[0], s[1].rel))
        hits = [
            Hit(note.title, note.rel, round(score, 3), snippet(note.text, q))
            for score, note in scored[: self.results]
        ]
        return hits, n


def snippet(text: str, q: list[str], width: int = 220) -> str:
    """The line that holds the most query terms, cut to ``width`` around the first one."""
    best, best_line = -1, ""
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        words = set(terms(line))
        score = sum(1 for t in q if t in words)
        if score > best:
            best, best_line = score, line.strip()
    if not best_line:
        return ""
    low = best_line.casefold()
    first = min((p for p in (low.find(t) for t in q) if p >= 0), default=0)
    start = max(0, first - width // 3)
    cut = best_line[start : start + width]
    return ("…" if start else "") + cut + ("…" if start + width < len(best_line) else "")
