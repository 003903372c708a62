"""The conversation's log as one parse: its rotated segments and the live file, read
incrementally (:class:`LogView`). This module never writes."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.errors import InputRejected
from contemplation.protocol.parser import merge, parse
from contemplation.store import logstream
from contemplation.store.layout import Conv, open_regular_stat, read_regular, read_to_end
from contemplation.values import Block, ParseResult

_SEGMENT_RE = re.compile(r"messages\.(\d+)\.log")
LONG_PARSE = 256 * 1024  # bytes of log parsed at once (~2 ms) above which it is done off the loop


def log_segments(conv: Conv, names: Callable[[], list[str]] | None = None) -> list[Path]:
    """Rotated segments oldest first, then the live log (``messages.N.log``: higher is older).
    ``names``: the folder's listing, when the caller (the lock holder) has taken it."""
    segs: list[tuple[int, Path]] = []
    try:
        for name in names() if names is not None else os.listdir(conv.dir):
            m = _SEGMENT_RE.fullmatch(name)
            if m:
                segs.append((int(m.group(1)), conv.dir / name))
    except FileNotFoundError:
        return []
    segs.sort(key=lambda t: -t[0])
    return [p for _, p in segs] + [conv.log]


def read_log_bytes(conv: Conv) -> bytes:
    try:
        return read_regular(conv.log)
    except (FileNotFoundError, InputRejected):
        return b""


parse_segment = logstream.parse_segment  # (its home was here: kept for its importers)


def _inodes(segments: list[Path]) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for p in segments:
        try:
            out.append((p.name, os.stat(p, follow_symlinks=False).st_ino))
        except FileNotFoundError:
            continue
    return tuple(out)


def segment_inodes(conv: Conv) -> tuple[tuple[str, int], ...]:
    """(name, inode) of every rotated segment: changes whenever a rotation happens."""
    return _inodes(log_segments(conv)[:-1])


def _read_segments(segments: list[Path], agent_label: str) -> tuple[Block, ...]:
    blocks: list[Block] = []
    for seg in segments:
        try:
            data = read_regular(seg)
        except (FileNotFoundError, InputRejected):
            continue
        blocks.extend(parse_segment(data, agent_label=agent_label).blocks)
    return tuple(blocks)


def _pread(fd: int, size: int, at: int) -> bytes:
    """``size`` bytes from ``at`` (fewer at the file's end), by position."""
    parts: list[bytes] = []
    while size > 0 and (got := os.pread(fd, min(size, 1 << 30), at)):
        parts.append(got)
        size, at = size - len(got), at + len(got)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class _Held:
    """A rotated segment whose blocks are held bare: where to read their text back."""

    path: Path
    ino: int
    first: int  # index of its first block in the view's history


def _index_segments(
    segments: list[Path], agent_label: str
) -> tuple[tuple[Block, ...], tuple[_Held, ...]]:
    """The rotated segments' blocks, bare (read a stretch at a time through logstream), and
    where each segment's blocks are."""
    blocks: list[Block] = []
    files: list[_Held] = []
    for seg in segments:
        try:
            fd, st = open_regular_stat(seg)
        except (FileNotFoundError, InputRejected):
            continue
        try:
            files.append(_Held(seg, st.st_ino, len(blocks)))
            for part in logstream.stream(fd, agent_label=agent_label):
                blocks.extend(logstream.bare(b) for b in part.blocks)
        finally:
            os.close(fd)
    return tuple(blocks), tuple(files)


@dataclass
class LogView:
    """An incrementally refreshed parse of one whole conversation.

    ``live`` is the parse of ``messages.log`` (offsets in that file), ``history`` the blocks of
    the rotated ``messages.N.log`` segments (read again only when the live file is a new one,
    i.e. after a rotation), ``result`` both together: what the model's history is built from.

    ``locked``: the caller holds the conversation's lock, so no rotation can run while the
    files are read (one listing of the folder instead of one before and one after).

    ``bare``: the rotated segments' blocks are held without their text (a log of any size
    costs a few hundred bytes a block, and the live file), read back on demand with
    :meth:`read_back` and :meth:`with_texts` (the lock holder only: the segments cannot be
    renamed meanwhile). ``history[:bare_count]`` are those blocks.
    """

    conv: Conv
    agent_label: str = "CLAUDE"
    result: ParseResult = field(default_factory=lambda: ParseResult(blocks=(), size=0))
    ino: int = 0
    live: ParseResult = field(default_factory=lambda: ParseResult(blocks=(), size=0))
    history: tuple[Block, ...] = ()
    locked: bool = False
    bare: bool = False
    held: tuple[_Held, ...] = ()  # with ``bare``: the segments the history was read from

    def refresh(
        self,
        known: os.stat_result | None = None,
        names: Callable[[], list[str]] | None = None,
        fd: int | None = None,
    ) -> ParseResult:
        """The parse as the log is now. ``known``: the log's stat (by name, links not
        followed) the caller has just taken, under the lock; ``names``: the folder's listing,
        if a whole read needs it (see :func:`log_segments`); ``fd``: the lock holder's open
        descriptor on the log, checked to be the file by that name (see
        :meth:`ConvWriter.check_identity`): it is read through, with no open of its own."""
        names = names if self.locked else None  # a listing is a snapshot only under the lock
        if fd is not None:
            return self._refresh_from(fd, known or os.fstat(fd), names)
        st = known or self._stat(None)
        if st is None:
            self._load_all(names)
            return self._combine()
        if self._holds(st) and stat.S_ISREG(st.st_mode):
            return self.result  # nothing new: one stat, no open
        try:
            fd, st = open_regular_stat(self.conv.log)
        except FileNotFoundError:
            self._load_all(names)
            return self._combine()
        try:
            return self._refresh_from(fd, st, names)
        finally:
            os.close(fd)

    async def refreshed(
        self,
        known: os.stat_result | None = None,
        names: Callable[[], list[str]] | None = None,
        fd: int | None = None,
    ) -> ParseResult:
        """:meth:`refresh` for the event loop: a long stretch to parse (see
        :meth:`long_refresh`) is parsed on a thread, awaited to its end even through a cancel
        (``fd`` stays open meanwhile). The caller holds the lock: nothing else writes."""
        st = known or self._stat(fd)  # taken once, for the check and the refresh
        if self.long_refresh(st, names, fd):
            from contemplation.base.aio import on_thread  # asyncio: a reader never loads it

            return await on_thread(lambda: self.refresh(st, names, fd))
        return self.refresh(st, names, fd)

    def long_refresh(
        self,
        known: os.stat_result | None = None,
        names: Callable[[], list[str]] | None = None,
        fd: int | None = None,
    ) -> bool:
        """Would :meth:`refresh` (same arguments) parse more than LONG_PARSE bytes: a long log
        at first sight or after a rotation (rotated segments are long), a long block appended?
        Such a refresh is run off the event loop (~9 ms a megabyte)."""
        names = names if self.locked else None
        st = known or self._stat(fd)
        if st is None:
            return False
        if st.st_ino == self.ino and st.st_size >= self.live.size:  # appended to: the tail
            start = self.live.blocks[-1].offset if self.live.blocks else 0
            return st.st_size - start > LONG_PARSE
        if st.st_size > LONG_PARSE:
            return True
        return names is not None and any(_SEGMENT_RE.fullmatch(n) for n in names())

    def _stat(self, fd: int | None) -> os.stat_result | None:
        """The live log's stat: through ``fd`` if open, else by name (None: no log)."""
        try:
            return os.fstat(fd) if fd is not None else os.stat(self.conv.log, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _holds(self, st: os.stat_result) -> bool:
        """The file last parsed, with nothing appended since."""
        return st.st_ino == self.ino and st.st_size == self.live.size

    def _refresh_from(
        self, fd: int, st: os.stat_result, names: Callable[[], list[str]] | None
    ) -> ParseResult:
        """Refresh from an open descriptor on the live log (``st``: its stat)."""
        if self._holds(st):
            return self.result
        if st.st_ino == self.ino and st.st_size > self.live.size:
            if self.live.blocks:  # the last block again (it may have been unfinished)
                start = self.live.blocks[-1].offset
                data = read_to_end(fd, st.st_size - start, start)
                tail = parse(data, agent_label=self.agent_label, base=start)
                self.live = merge(self.live, tail, start)
            else:
                data = read_to_end(fd, st.st_size)
                self.live = logstream.parse_segment(data, agent_label=self.agent_label)
            return self._combine()
        # a new file (first sight, a rotation): read whole, through this descriptor if the
        # lock is held (else the segments are listed first, then the log opened again, so
        # that a rotation meanwhile is seen)
        self._load_all(names, opened=(fd, st) if self.locked else None)
        return self._combine()

    def _load_all(
        self,
        names: Callable[[], list[str]] | None = None,
        opened: tuple[int, os.stat_result] | None = None,
    ) -> None:
        """Parse the segments and the live log from scratch, again if a rotation ran meanwhile.
        ``opened``: a descriptor on the live log the caller has open (and its stat), read on
        the first pass instead of opening the log again."""
        data, ino = b"", 0
        history: tuple[Block, ...] = ()
        for _ in range(20):
            segments = log_segments(self.conv, names)[:-1]
            before = _inodes(segments)
            if self.bare:
                history, self.held = _index_segments(segments, self.agent_label)
            else:
                history = _read_segments(segments, self.agent_label)
            if opened is not None:
                (fd, st), opened = opened, None
                ino, data = st.st_ino, read_to_end(fd, st.st_size)
            else:
                ino, data = self._read_live()
            if self.locked or segment_inodes(self.conv) == before:
                break
        self.history, self.ino = history, ino
        self.live = logstream.parse_segment(data, agent_label=self.agent_label)

    def _read_live(self) -> tuple[int, bytes]:
        """The live log's inode and bytes, by name (0 and nothing when there is none)."""
        try:
            fd, st = open_regular_stat(self.conv.log)
        except FileNotFoundError:
            return 0, b""
        try:
            return st.st_ino, read_to_end(fd, st.st_size)
        finally:
            os.close(fd)

    def _combine(self) -> ParseResult:
        live = self.live
        self.result = (
            ParseResult(
                blocks=self.history + live.blocks,
                size=live.size,
                preamble=live.preamble,
                errors=live.errors,
            )
            if self.history
            else live
        )
        return self.result

    @property
    def bare_count(self) -> int:
        """How many of the result's first blocks are held bare (see the class)."""
        return len(self.history) if self.bare else 0

    def read_back(self, stop: int) -> Iterator[tuple[int, Block]]:
        """The bare blocks before index ``stop``, newest first, each with its text read back
        from its segment (a stretch of at most ~``logstream.CHUNK`` bytes at a time, a
        block by its first ``logstream.MAX_BLOCK_BYTES``, as the index reads it). A segment
        that is no longer the file read gives its blocks bare."""
        stop = min(stop, self.bare_count)
        for held in reversed(self.held):
            if held.first >= stop:
                continue
            yield from self._back_in(held, stop)
            stop = held.first

    def with_texts(self, blocks: tuple[Block, ...], wanted: Iterable[int]) -> tuple[Block, ...]:
        """``blocks`` (the result) with the bare blocks at the indexes ``wanted`` read back."""
        out = list(blocks)
        for i in sorted({i for i in wanted if 0 <= i < self.bare_count}, reverse=True):
            for _, b in self.read_back(i + 1):
                out[i] = b
                break
        return tuple(out)

    def _back_in(self, held: _Held, stop: int) -> Iterator[tuple[int, Block]]:
        try:
            fd, st = open_regular_stat(held.path)
        except (FileNotFoundError, InputRejected):
            fd, st = -1, None
        try:
            same = st is not None and st.st_ino == held.ino
            hi, h = stop, self.history
            while hi > held.first:
                lo = hi - 1  # a stretch of whole blocks, newest first, of about CHUNK bytes
                while lo > held.first and h[hi - 1].end - h[lo - 1].offset <= logstream.CHUNK:
                    lo -= 1
                got = self._texts(fd, lo, hi) if same else {}
                for i in range(hi - 1, lo - 1, -1):
                    b = self.history[i]
                    yield i, got.get(b.offset, b)
                hi = lo
        finally:
            if fd >= 0:
                os.close(fd)

    def _texts(self, fd: int, lo: int, hi: int) -> dict[int, Block]:
        """The blocks ``history[lo:hi]`` (one segment's) read back, by their offsets."""
        first, last = self.history[lo], self.history[hi - 1]
        size = min(last.end - first.offset, max(logstream.CHUNK, logstream.MAX_BLOCK_BYTES))
        data = _pread(fd, size, first.offset)
        parsed = parse(data, agent_label=self.agent_label, base=first.offset)
        out: dict[int, Block] = {}
        for b in parsed.blocks:
            bare = self.history[lo + len(out)] if lo + len(out) < hi else None
            if bare is None or bare.offset != b.offset:
                break
            out[b.offset] = dataclasses.replace(bare, text=b.text, thinking=b.thinking)
        return out
