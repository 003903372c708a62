"""Is a file still open for writing? The kernel's own answer, where there is one.

The inbox rule (docs/reference/format.md, "Sending a message") takes a file written in place
once it has been quiet for ``settle_seconds`` *and* no process holds it open for writing.
This module answers the second half, read-only:

* Linux: a read lease, ``fcntl(F_SETLEASE, F_RDLCK)``, is granted only while no process has
  the file open for writing (EAGAIN otherwise), and let go at once. The lease's break signal
  is set to SIGURG first (ignored unless a handler is installed): a writer that opens the file
  in the microseconds the lease is held waits for its release, instead of the kernel's
  default SIGIO ending the daemon. A lease needs the file's owner or CAP_LEASE.
* Linux without a lease (EACCES: another user's file and no CAP_LEASE; EINVAL: a file system
  without leases, or ``fs.leases-enable`` = 0): the open files under ``/proc/<pid>/fd`` this
  process may read (its own user's processes; all of them as root) are looked at, at most
  :data:`PROC_FDS_MAX` descriptors; one on the same file (device and inode) whose fdinfo flags
  say write is a writer. Past that bound the answer is unknown.
* Elsewhere (macOS, BSD): unknown; the settle rule alone applies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import sys
from pathlib import Path

from contemplation.store.layout import Conv, Home, inbox_entries, list_conversations

LINUX = sys.platform.startswith("linux")
PROC_FDS_MAX = 65_536  # descriptors looked at in /proc, all processes together
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITES = (os.O_WRONLY, os.O_RDWR)


def being_written(path: Path) -> bool | None:
    """True: some process holds the regular file ``path`` open for writing now; False: none
    does; None: this system cannot tell (or ``path`` is gone, a link, not a regular file)."""
    if not LINUX:
        return None
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        held = _lease_says(fd)
    finally:
        os.close(fd)
    return held if held is not None else proc_says(st.st_dev, st.st_ino)


def _lease_says(fd: int) -> bool | None:
    """The read lease's answer on a read-only descriptor (None: no lease here)."""
    if signal.getsignal(signal.SIGURG) not in (signal.SIG_DFL, signal.SIG_IGN):
        return None  # someone handles SIGURG: a lease break must not reach that handler
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        return True if exc.errno == errno.EAGAIN else None
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return False


def proc_says(dev: int, ino: int, limit: int = PROC_FDS_MAX) -> bool | None:
    """Does a process this one may look at hold the file (``dev``, ``ino``) open for
    writing? None: no /proc, or more than ``limit`` descriptors to look at."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    looked = 0
    for pid in pids:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:  # gone, or another user's
            continue
        looked += len(names)
        if looked > limit:
            return None
        for name in names:
            try:
                st = os.stat(f"{fds}/{name}")
            except OSError:
                continue
            if st.st_ino == ino and st.st_dev == dev and _writes(pid, name):
                return True
    return False


def _writes(pid: str, fd: str) -> bool:
    """Descriptor ``fd`` of process ``pid`` was opened for writing (its fdinfo's flags)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as f:
            for line in f:
                if line.startswith("flags:"):
                    return (int(line.split()[1], 8) & os.O_ACCMODE) in _WRITES
    except (OSError, ValueError, IndexError):
        return False  # closed meanwhile
    return False


def being_written_in(conv: Conv) -> list[str]:
    """The names of ``conv``'s inbox files some process holds open for writing (``status``,
    ``doctor``): the daemon leaves them where they are until they are closed."""
    return [e.name for e in inbox_entries(conv) if being_written(e.path)]


def being_written_at(home: Home) -> list[tuple[str, str]]:
    """(conversation id, inbox file name) for every file still being written in an active
    conversation's inbox."""
    return [(c.id, n) for c in list_conversations(home) for n in being_written_in(c)]
