"""``Obsidian notes matching <query>``: ranked full-text search over a folder of Markdown notes.

The vault is scanned (``*.md``, hidden folders such as ``.obsidian`` and ``.trash`` skipped,
symlinks that leave the vault ignored) and indexed in memory; a note is re-read only when
its size or mtime changes. Ranking is BM25 over the body plus a boosted title match (the
first ``# heading``, else the file name). Each hit comes back with its title, its path in the
vault and a snippet around the best-matching line.

A note is read in chunks: its words are counted over its first ``max_scan_bytes`` (32 MiB)
while only its first ``max_note_bytes`` (1 MiB) are kept as text; a hit whose words lie past
that text gets its snippet by reading the note again, line by line. One search reads at most
``max_scan_total`` (64 MiB) of notes past their first MiB; a note it cannot afford is searched
in its first MiB this time and read whole by a later search. A note searched in part, and
one that cannot be read, is named in the answer's note, so "N notes searched" is true.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import stat
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from contemplation.errors import ToolError
from contemplation.needs.tools.base import ToolResult, Unconfigured, text_arg

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
_TITLE_RE = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)
_STOP = "a an and are as at be by for from how in is it of on or that the this to was what when"
STOPWORDS = frozenset((_STOP + " where which who why with about into notes note matching").split())
K1, B, TITLE_BOOST = 1.4, 0.75, 2.5
CHUNK = 1 << 20  # bytes read at a time
MAX_LINE = 64 * 1024  # bytes of one line looked at for a snippet
NAMED = 5  # notes named in the answer's note at most


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
    searched: int  # bytes whose words were counted (less than the size: searched in part)
    path: Path  # the note's real path, to find a snippet past ``text``

    @property
    def partial(self) -> bool:
        return self.searched < self.key[0]


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
        max_scan_bytes: int = 32 * 1024 * 1024,
        max_scan_total: int = 64 * 1024 * 1024,
        results: int = 5,
    ) -> None:
        self.vault = Path(vault).expanduser() if vault else None
        self.max_notes = max_notes
        self.max_note_bytes = max_note_bytes
        self.max_scan_bytes = max(max_scan_bytes, max_note_bytes)
        self.max_scan_total = max_scan_total
        self.results = results
        self._index: dict[str, _Note] = {}
        self._lock = threading.Lock()
        self.skipped = 0
        self.unreadable: list[str] = []

    @property
    def ready(self) -> bool:  # offered to the model only with a vault
        return self.vault is not None

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
        """What the search did not see whole: notes over the scan bound (their first part was
        searched), notes that could not be read and notes past the count bound."""
        with self._lock:
            partial = sorted((n for n in self._index.values() if n.partial), key=lambda n: n.rel)
            unreadable = list(self.unreadable)
            skipped = self.skipped
        said = []
        if partial:
            shown = [f"{n.rel} (its first {n.searched:,} of {n.key[0]:,} bytes)" for n in partial]
            was = "was" if len(partial) == 1 else "were"
            said.append(f"{_notes(len(partial))} {was} searched in part only: {_names(shown)}")
        if unreadable:
            said.append(f"{_notes(len(unreadable))} could not be read: {_names(unreadable)}")
        if skipped:
            said.append(f"{skipped:,} note(s) past the first {self.max_notes:,} were not searched")
        return "; ".join(said)

    # -- index ------------------------------------------------------------------------

    def _root(self) -> Path:
        if self.vault is None:
            raise Unconfigured(
                "no notes vault is available", hint="set tools.notes_vault in the config"
            )
        try:
            return self.vault.resolve(strict=True)
        except OSError:
            raise ToolError(f"the notes vault {self.vault} does not exist") from None

    def refresh(self) -> dict[str, _Note]:
        root = self._root()
        seen: dict[str, _Note] = {}
        skipped = 0
        unreadable: list[str] = []
        left = self.max_scan_total  # bytes this refresh may read of notes over max_note_bytes
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if not name.lower().endswith(".md") or name.startswith("."):
                    continue
                if len(seen) >= self.max_notes:
                    skipped += 1
                    continue
                path = Path(dirpath) / name
                try:
                    note, spent = self._load(root, path, left)
                except OSError:
                    unreadable.append(path.relative_to(root).as_posix())
                    continue
                left -= spent
                if note is not None:
                    seen[note.rel] = note
        with self._lock:
            self._index = seen
            self.skipped = skipped
            self.unreadable = unreadable
        return seen

    def _load(self, root: Path, path: Path, left: int) -> tuple[_Note | None, int]:
        """The note at ``path`` (from the index when unchanged, and searched whole or as far
        as it can be) and the bytes read of it past ``max_note_bytes``; None when it is no
        note (a link out of the vault, not a regular file); OSError when it cannot be read.
        A large note is read up to ``max_scan_bytes`` when ``left`` holds that, else only its
        first ``max_note_bytes`` (a later refresh reads it again)."""
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                real = path.resolve(strict=True)
                if not real.is_relative_to(root):
                    return None, 0  # a link out of the vault
                st = os.stat(real)
                path = real
            if not stat.S_ISREG(st.st_mode):
                return None, 0
        except OSError:
            return None, 0
        rel = path.relative_to(root).as_posix()
        key = (st.st_size, st.st_mtime_ns)
        whole = min(st.st_size, self.max_scan_bytes)
        old = self._index.get(rel)
        if old is not None and old.key == key and old.searched >= whole:
            return old, 0
        cap = whole if whole <= self.max_note_bytes + max(left, 0) else self.max_note_bytes
        with _open(path) as f:
            head, tf, searched = scan(f, self.max_note_bytes, cap)
        text = head.decode("utf-8", errors="replace")
        m = _TITLE_RE.search(text)
        title = m.group(1).strip() if m else path.stem
        note = _Note(
            rel,
            title,
            text,
            tf,
            frozenset(terms(title + " " + path.stem)),
            tf.total(),
            key,
            searched,
            path,
        )
        return note, max(0, searched - self.max_note_bytes)

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
            Hit(note.title, note.rel, round(score, 3), self._snippet(note, q))
            for score, note in scored[: self.results]
        ]
        return hits, n

    def _snippet(self, note: _Note, q: list[str]) -> str:
        """The snippet from the note's text; when its words lie past that text (a large
        note), from the line that holds the most of them, read again in chunks."""
        score, line = best_line(note.text.splitlines(), q)
        if score > 0 or note.searched <= self.max_note_bytes:
            return around(line, q)
        try:
            with _open(note.path) as f:
                score, line = best_line(_lines(f, note.searched), q)
        except OSError:
            pass  # gone or changed since it was indexed: the head's best line stands
        return around(line, q)


def _notes(n: int) -> str:
    return "1 note" if n == 1 else f"{n:,} notes"


def _names(names: list[str]) -> str:
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


def _open(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    return os.fdopen(fd, "rb")


def scan(f: BinaryIO, keep: int, cap: int) -> tuple[bytes, Counter[str], int]:
    """A note read in chunks: its first ``keep`` bytes, the terms of its first ``cap`` bytes
    (cut between lines, else between words), and how many bytes that was."""
    head = bytearray()
    tf: Counter[str] = Counter()
    carry = b""
    read = 0
    while read < cap:
        chunk = f.read(min(CHUNK, cap - read))
        if not chunk:
            break
        read += len(chunk)
        if len(head) < keep:
            head += chunk[: keep - len(head)]
        data = carry + chunk
        cut = max(data.rfind(b"\n"), data.rfind(b" ") if len(data) > CHUNK else -1)
        if cut < 0 and len(data) <= CHUNK:
            carry = data
            continue
        cut = cut if cut >= 0 else len(data) - 1
        tf.update(terms(data[: cut + 1].decode("utf-8", errors="replace")))
        carry = data[cut + 1 :]
    tf.update(terms(carry.decode("utf-8", errors="replace")))
    return bytes(head), tf, read


def _lines(f: BinaryIO, cap: int) -> Iterator[str]:
    """The lines of ``f`` within its first ``cap`` bytes, each at most MAX_LINE bytes."""
    read = 0
    while read < cap:
        raw = f.readline(min(MAX_LINE, cap - read))
        if not raw:
            return
        read += len(raw)
        yield raw.decode("utf-8", errors="replace")


def best_line(lines: Iterable[str], q: list[str]) -> tuple[int, str]:
    """The line that holds the most query terms (headings and blank lines left out), and
    how many it holds."""
    best, found = -1, ""
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        words = set(terms(line))
        score = sum(1 for t in q if t in words)
        if score > best:
            best, found = score, line.strip()
            if score == len(q):
                break
    return best, found


def around(line: str, q: list[str], width: int = 220) -> str:
    """``line`` cut to ``width`` around the first query term in it."""
    if not line:
        return ""
    low = line.casefold()
    first = min((p for p in (low.find(t) for t in q) if p >= 0), default=0)
    start = max(0, first - width // 3)
    cut = line[start : start + width]
    return ("…" if start else "") + cut + ("…" if start + width < len(line) else "")
