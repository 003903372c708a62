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


@dataclass
class Tracked:
    fast_ready: set[Path] = field(default_factory=set)  # inbox files that arrived by rename
    cancelled: set[str] = field(default_factory=set)  # tasks cancelled at the agent's request
    recovered: set[str] = field(default_factory=set)  # conversations recovered since start
    views: dict[str, LogView] = field(default_factory=dict)  # incremental parses of the logs
    log_sizes: dict[str, int] = field(default_factory=dict)  # what the daemon last left
    # inbox files found settled but still open for writing: (size, mtime) last logged
    writing: dict[Path, tuple[int, int]] = field(default_factory=dict)
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
