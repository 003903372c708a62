"""Whether the disk a home is on has room left: a full disk said as such.

While the disk is full the daemon cannot write state.json either, so the state a face reads
still says what the turn was doing when its write failed ("generating"); the faces ask the
file system itself (``statvfs``, a system call: no file is read) and say "the disk is full"
while it lasts. The same bound tells SQLite's 'disk I/O error' on the index for a full disk.
"""

from __future__ import annotations

import os
from pathlib import Path

NO_ROOM = 64 << 10  # free bytes under which a disk counts as full


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use where ``folder`` is (None: not known)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def full(folder: Path) -> str:
    """"the disk is full (12 KiB free where /home/… is)" while the disk is full, else ""."""
    free = free_bytes(folder)
    if free is None or free >= NO_ROOM:
        return ""
    return f"the disk is full ({free // 1024} KiB free where {folder} is)"
