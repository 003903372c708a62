"""Atomic files and locks: the two primitives every write under the home is made of.

* temp file in the same folder, fsync, ``os.replace``, fsync of the folder: a reader sees the
  old or the new file, never half of one;
* ``flock`` (never POSIX ``lockf``: it does not exclude our own threads and any close drops it)
  on ``<conv>/.lock`` for every change to a conversation, and on ``<home>/.daemon.lock`` for
  the one daemon per home.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contemplation.base.privacy import DIR_MODE, FILE_MODE
from contemplation.base.testing import crashpoint
from contemplation.errors import AlreadyRunning
from contemplation.store.layout import Conv, Home, read_json

if TYPE_CHECKING:  # the durable points load with the first write: a face that only asks
    # daemon_alive (status) never makes one
    from contemplation.writer.durable import Steps


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def fsync_dir(path: Path) -> None:
    from contemplation.writer.durable import fsync_path

    fsync_path(path, os.O_DIRECTORY)


_TMP_PREFIX = secrets.token_hex(3)  # with a counter: unique temp names without a getrandom each
_tmp_counter = itertools.count()
_pid = os.getpid()  # in every temp name (a system call less per write); a fork updates it


def _forked() -> None:
    global _pid  # noqa: PLW0603 - the one process-wide value, changed only by a fork
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def atomic_write_steps(
    path: Path,
    data: bytes,
    *,
    durable: bool = True,
    mode: int = FILE_MODE,
    dev: int | None = None,
    written: Callable[[], None] | None = None,
) -> Steps[None]:
    """:func:`atomic_write_bytes` as steps (see :mod:`.durable`): the temp file is durable
    before the rename, the rename before the steps end. ``dev``: the file system of
    ``path``'s folder, if the caller knows it. ``written``: called once the temp file holds
    ``data`` and, when durable, once it is on disk by name too: the temp file is then the
    record of what ``written`` writes (a reply's last bytes, see :mod:`.recovery`), and the
    next point, with no file of its own, is where the caller makes those writes durable
    before the rename."""
    from contemplation.writer.durable import Durable

    tmp = path.with_name(f".{path.name}.tmp.{_pid}.{_TMP_PREFIX}{next(_tmp_counter)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        if written is None:
            if durable:
                yield Durable(files=(fd,), dev=dev)
        else:
            crashpoint("reply_record")  # the record of what written() writes, not durable
            if durable:
                yield Durable(files=(fd,), folders=(path.parent,), dev=dev)
            written()
            if durable:
                yield Durable(dev=dev)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    crashpoint(_point(path))
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        yield Durable(folders=(path.parent,), dev=dev)


def _point(path: Path) -> str:
    """The crash point of an atomic write of ``path`` (see :mod:`contemplation.base.testing`):
    named by what the file records."""
    if path.parent.name == "tasks":
        return "task_tmp"
    return _POINTS.get(path.name, "file_tmp")


_POINTS = {"state.json": "state_tmp", "metadata.json": "metadata_tmp", "memory.json": "memory_tmp"}


def atomic_write_bytes(
    path: Path, data: bytes, *, durable: bool = True, mode: int = FILE_MODE
) -> None:
    from contemplation.writer.durable import run_now

    run_now(atomic_write_steps(path, data, durable=durable, mode=mode))


def atomic_write_json(path: Path, data: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(
        path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode(), durable=durable
    )


def staging_name(final: str) -> str:
    """The dot-name a message is written under in ``inbox/`` before its rename into
    ``final``: it names its writer's process, so that what a killed sender (or a power cut
    before its rename) left is known for stale (``folders.remove_stale_deliveries``)."""
    return f".{final}.tmp.{os.getpid()}.{secrets.token_hex(3)}"


def cache_write(path: Path, data: bytes) -> None:
    """A cache file, not a record of the home: written whole by a rename, owner-only, never
    fsynced and outside the crash model (a process killed here leaves at most its temp file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# --------------------------------------------------------------------------- locks


class DaemonLock:
    """One daemon per home: an exclusive ``flock`` held for the daemon's lifetime."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._fd: int | None = None

    def acquire(self) -> None:
        self.home.root.mkdir(DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(self.home.daemon_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = read_json(self.home.daemon_info) or {}
            os.close(fd)
            who = f" (pid {info['pid']})" if "pid" in info else ""
            raise AlreadyRunning(
                f"another contemplation daemon is already running on {self.home.root}{who}; "
                "stop it first or use a different --home"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.home.daemon_info)
            os.close(self._fd)
            self._fd = None


def daemon_alive(home: Home) -> bool:
    """True when some process holds the daemon lock of ``home``."""
    try:
        fd = os.open(home.daemon_lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def faces_lock(conv: Conv) -> Iterator[None]:
    """Serialise the faces' read-then-write actions on one conversation (two ``respond``
    calls at once). A lock of its own, ``<conv>/.faces.lock``: the daemon holds the
    conversation's lock for a whole reply, and an agent must not wait for that."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(conv.dir / ".faces.lock", flags, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def conv_lock(conv: Conv, *, blocking: bool = True, shared: bool = False) -> Iterator[bool]:
    """Hold ``flock(<conv>/.lock)``. Yields False (lock not taken) only when non-blocking.
    ``shared``: a reader's lock (a fork's read), held by any number of readers at once and
    by none while a writer holds it."""
    fd = os.open(conv.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        try:
            fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock
