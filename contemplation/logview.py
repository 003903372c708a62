"""The conversation's log as one parse: its rotated segments and the live file, read
incrementally (:class:`LogView`). This module never writes."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.aio import on_thread
from contemplation.errors import InputRejected
from contemplation.layout import Conv, open_regular_stat, read_regular, read_to_end
from contemplation.logformat import FRAME_OPEN
from contemplation.models import Block, MarkerKind, ParseResult
from contemplation.parser import merge, parse

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


_CONTINUED = f"{FRAME_OPEN}{MarkerKind.CONTINUED.value}".encode()


def parse_segment(data: bytes, *, agent_label: str = "CLAUDE") -> ParseResult:
    """Parse one file of the log. The ``=== CONTINUED ... ===`` line a rotation writes at the
    top of a new ``messages.log`` is a system line, not text before the first header."""
    skip = 0
    if data.startswith(_CONTINUED):
        nl = data.find(b"\n")
        skip = len(data) if nl < 0 else nl + 1
    result = parse(data[skip:], agent_label=agent_label, base=skip)
    return dataclasses.replace(result, size=result.size + skip) if skip else result


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


@dataclass
class LogView:
    """An incrementally refreshed parse of one whole conversation.

    ``live`` is the parse of ``messages.log`` (offsets in that file), ``history`` the blocks of
    the rotated ``messages.N.log`` segments (read again only when the live file is a new one,
    i.e. after a rotation), ``result`` both together: what the model's history is built from.

    ``locked``: the caller holds the conversation's lock, so no rotation can run while the
    files are read (one listing of the folder instead of one before and one after).
    """

    conv: Conv
    agent_label: str = "CLAUDE"
    result: ParseResult = field(default_factory=lambda: ParseResult(blocks=(), size=0))
    ino: int = 0
    live: ParseResult = field(default_factory=lambda: ParseResult(blocks=(), size=0))
    history: tuple[Block, ...] = ()
    locked: bool = False

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
                self.live = parse_segment(data, agent_label=self.agent_label)
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
            history = _read_segments(segments, self.agent_label)
            if opened is not None:
                (fd, st), opened = opened, None
                ino, data = st.st_ino, read_to_end(fd, st.st_size)
            else:
                ino, data = self._read_live()
            if self.locked or segment_inodes(self.conv) == before:
                break
        self.history, self.ino = history, ino
        self.live = parse_segment(data, agent_label=self.agent_label)

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
