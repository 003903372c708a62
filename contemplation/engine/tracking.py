"""What the daemon remembers about each conversation between steps.

One :class:`Tracked` is owned by the dispatcher (or by one burst of ``process_pending``) and
passed explicitly to every step, turn and answer round; the :class:`~contemplation.engine.runtime.
Runtime` holds only services. Everything here is a cache or a hint: losing it (a restart)
costs a re-read, never correctness.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.store.layout import Conv, InboxEntry
from contemplation.store.logview import LogView

WRITING_KEPT = 10_000  # inbox files still being written that the log has named
QUIET_KEPT = 10_000  # inbox files settling, as last seen


@dataclass
class Tracked:
    fast_ready: set[Path] = field(default_factory=set)  # inbox files that arrived by rename
    cancelled: set[str] = field(default_factory=set)  # tasks cancelled at the agent's request
    recovered: set[str] = field(default_factory=set)  # conversations recovered since start
    views: dict[str, LogView] = field(default_factory=dict)  # incremental parses of the logs
    log_sizes: dict[str, int] = field(default_factory=dict)  # what the daemon last left
    # inbox files found settled but still open for writing: (size, mtime) last logged
    writing: dict[Path, tuple[int, int]] = field(default_factory=dict)
    # inbox files settling: (size, mtime) as last seen, and since when (the monotonic clock)
    quiet: dict[Path, tuple[int, int, float]] = field(default_factory=dict)
    # conversations whose steps failed (a full disk): failures in a row, and the error said
    failing: dict[str, tuple[int, str]] = field(default_factory=dict)
    # conversations whose reply a failed write cut: what failed (said by its INTERRUPTED line)
    cut_by: dict[str, str] = field(default_factory=dict)
    stopping: bool = False  # set on SIGTERM: finish the current turn, take nothing new
    # this run of the daemon (or burst): what a turn it begins records (see inflight.py)
    run: str = field(default_factory=lambda: secrets.token_hex(6))

    def view(self, conv: Conv, agent_label: str) -> LogView:
        v = self.views.get(conv.id)
        if v is None or v.conv != conv or v.agent_label != agent_label:
            # read under the conversation's lock only: no rotation runs meanwhile
            v = self.views[conv.id] = LogView(conv, agent_label, locked=True, bare=True)
        return v

    def still_written(self, entry: InboxEntry) -> bool:
        """An inbox file has settled but a process still holds it open for writing: True
        the first time it is seen so (and after each change of the file), to say it once."""
        now = (entry.size, entry.mtime_ns)
        if self.writing.get(entry.path) == now:
            return False
        if len(self.writing) >= WRITING_KEPT:
            self.writing.clear()
        self.writing[entry.path] = now
        return True

    def quiet_for(self, entry: InboxEntry, steady: float) -> float:
        """How long an inbox file has been seen unchanged (size and mtime), measured on the
        monotonic clock ``steady``: 0 at first sight and after each change. A file's age read
        from the wall clock and its mtime is wrong by as much as the clock was stepped since
        it was written; this is not."""
        now = (entry.size, entry.mtime_ns)
        was = self.quiet.get(entry.path)
        if was is not None and was[:2] == now:
            return max(0.0, steady - was[2])
        if len(self.quiet) >= QUIET_KEPT:
            self.quiet.clear()
        self.quiet[entry.path] = (*now, steady)
        return 0.0

    def failed(self, conv_id: str, what: str) -> tuple[int, bool]:
        """One more failure in a row: how many now, and whether ``what`` differs from the
        error said last time (a repeat is not said again)."""
        n, said = self.failing.get(conv_id, (0, ""))
        self.failing[conv_id] = (n + 1, what)
        return n + 1, what != said

    def remember_size(self, conv: Conv) -> None:
        try:
            self.log_sizes[conv.id] = os.stat(conv.log).st_size
        except OSError:
            self.log_sizes.pop(conv.id, None)

    def forget(self, conv_id: str) -> None:
        self.views.pop(conv_id, None)
        self.log_sizes.pop(conv_id, None)
        self.recovered.discard(conv_id)
        self.failing.pop(conv_id, None)
        self.cut_by.pop(conv_id, None)
