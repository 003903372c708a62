"""A fork's folder: built whole under a dot-name in ``active/``, then renamed into place.

What to put in it (which blocks, which segments, the metadata) is decided by
:mod:`contemplation.faces.fork`; this module only writes. A crash (a SIGKILL included) before the
rename leaves a hidden ``.fork-<pid>-<rand>`` folder that no face lists and no daemon takes,
removed by the next fork in the same home; after it, a whole conversation.

The source's files are copied file to file (``copy_file_range``, else a chunk at a time) or
hard-linked, never read into memory: a fork of a log of any size holds a chunk of it at most.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contemplation.base.privacy import DIR_MODE, FILE_MODE
from contemplation.base.testing import crashpoint
from contemplation.errors import InputRejected
from contemplation.models import Metadata, Status
from contemplation.store.layout import ATTACHMENTS, LOG_NAME, Conv, Home, list_folder, slugify
from contemplation.writer.files import atomic_write_json, fsync_dir, now_iso, write_all
from contemplation.writer.folders import ensure_conversation_files, ensure_home, pid_alive
from contemplation.writer.session import rebuild_state

STAGING_PREFIX = ".fork-"
STALE_STAGING_SECONDS = 24 * 3600.0  # a staging folder of a live pid this old is stale anyway
NAMES_TRIED = 1000  # conv_<stamp>_<slug>, -2, -3, ...


COPY_CHUNK = 1 << 20  # bytes copied at once where the kernel cannot copy file to file


@dataclass(frozen=True, slots=True)
class Segment:
    """A file of the source's log as the fork read it: its path, its inode (the file is
    found by it when a rotation renamed it since) and the bytes read."""

    path: Path
    ino: int
    size: int


@dataclass(frozen=True, slots=True)
class Head:
    """The fork's live log: the first ``length`` bytes of ``segment``, and a newline."""

    segment: Segment
    length: int


def source_fd(seg: Segment) -> int:
    """A descriptor open for reading on the file the fork read as ``seg`` (see
    :func:`_names`)."""
    for path in _names(seg):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        if os.fstat(fd).st_ino == seg.ino:
            return fd
        os.close(fd)
    raise InputRejected(f"{seg.path.name} of {seg.path.parent.name} is gone since it was read")


def _names(seg: Segment) -> list[Path]:
    """Where the file read as ``seg`` may be now: its name, then (a rotation renames the
    log's files) every file of the log in its folder."""
    out = [seg.path]
    with contextlib.suppress(OSError):
        out += [seg.path.parent / n for n in sorted(os.listdir(seg.path.parent)) if _log_file(n)]
    return out


def _log_file(name: str) -> bool:
    return name == LOG_NAME or (name.startswith("messages.") and name.endswith(".log"))


def build_fork(
    home: Home,
    meta: Metadata,
    *,
    log: Head,
    segments: Sequence[Segment] = (),
    attachments: Path | None = None,
    status: Status = Status.PENDING,
    durable: bool = True,
    then: str = "",
) -> Conv:
    """Make a new conversation in ``active/`` whose ``messages.log`` is ``log`` (the head
    of a file of the source's log, copied) and whose rotated segments are
    ``segments`` (oldest first: they become ``messages.N.log`` … ``messages.1.log``,
    hard-linked, copied where a link cannot be made). ``attachments``: a
    folder copied (linked) as ``attachments/``. ``then``: system lines (a marker) that end
    the log after the copied blocks. The state is rebuilt from that log, with ``status``;
    ``meta``'s id is the folder's name, made from its topic.

    Nothing is visible in ``active/`` until the folder is whole (and, with ``durable``, on
    disk): it is built under a dot-name and renamed, never over an existing folder."""
    ensure_home(home)
    remove_stale_staging(home)
    staging = home.active / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir(DIR_MODE)
    try:
        _stage(Conv(staging), meta, log, segments, attachments, status, durable=durable, then=then)
        made = _place(home, Conv(staging), meta, durable=durable)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return made


def _stage(  # noqa: PLR0917 - the parts of one folder
    conv: Conv,
    meta: Metadata,
    log: Head,
    segments: Sequence[Segment],
    attachments: Path | None,
    status: Status,
    *,
    durable: bool,
    then: str = "",
) -> None:
    """The fork's files under its dot-name: log, segments, attachments, state."""
    _copy_new(conv.log, log.segment, log.length, durable=durable, then=b"\n" + then.encode())
    for n, seg in enumerate(reversed(segments), start=1):  # the newest is messages.1.log
        _place_segment(seg, conv.dir / f"messages.{n}.log", durable=durable)
    if attachments is not None and attachments.is_dir():
        shutil.copytree(
            attachments,
            conv.dir / ATTACHMENTS,
            symlinks=True,
            copy_function=lambda s, d: _link_or_copy(Path(s), Path(d), durable=durable),
        )
        for folder, _, _ in os.walk(conv.dir / ATTACHMENTS):
            os.chmod(folder, DIR_MODE)  # copytree gave it the source's mode
            if durable:  # the names in it (the files are durable already)
                fsync_dir(Path(folder))
    crashpoint("fork_staged")
    state = rebuild_state(conv, meta, list_folder(conv))
    state.status = status
    state.updated = now_iso()
    atomic_write_json(conv.state, state.model_dump(mode="json"), durable=durable)


def _place(home: Home, staging: Conv, meta: Metadata, *, durable: bool) -> Conv:
    """Name the staged fork after its topic and rename it into ``active/`` (never over a
    folder that exists: the next free name then)."""
    base = f"conv_{time.strftime('%Y%m%d-%H%M%S')}_{slugify(meta.topic)}"
    for n in range(NAMES_TRIED):
        name = base if n == 0 else f"{base}-{n + 1}"
        if os.path.lexists(home.active / name) or os.path.lexists(home.completed / name):
            continue
        fields = meta.model_dump(mode="json") | {"id": name}
        atomic_write_json(staging.metadata, fields, durable=durable)
        ensure_conversation_files(staging, Metadata.model_validate(fields), durable=durable)
        if durable:
            fsync_dir(staging.dir)
        crashpoint("fork")
        if _rename_noreplace(staging.dir, home.active / name):
            crashpoint("fork_renamed")
            if durable:
                fsync_dir(home.active)
            return Conv(home.active / name)
    raise InputRejected(f"too many conversations named {base}")


def remove_stale_staging(home: Home) -> None:
    """Remove the staging folders of forks whose process is gone (a crash mid-fork)."""
    try:
        names = [n for n in os.listdir(home.active) if n.startswith(STAGING_PREFIX)]
    except FileNotFoundError:
        return
    now = time.time()
    for name in names:
        path = home.active / name
        try:
            pid = int(name[len(STAGING_PREFIX) :].split("-", 1)[0])
            age = now - os.stat(path, follow_symlinks=False).st_mtime
        except (ValueError, OSError):
            continue
        if pid != os.getpid() and (not pid_alive(pid) or age > STALE_STAGING_SECONDS):
            shutil.rmtree(path, ignore_errors=True)


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


def _copy_new(path: Path, seg: Segment, length: int, *, durable: bool, then: bytes = b"") -> None:
    """A new file at ``path``: the first ``length`` bytes of the file read as ``seg``
    (copied by the kernel, or a chunk at a time), and ``then``."""
    src = source_fd(seg)
    try:
        fd = os.open(path, _NEW_FILE, FILE_MODE)
        try:
            _copy_range(src, fd, length, seg)
            write_all(fd, then)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.close(src)


def _copy_range(src: int, dst: int, length: int, seg: Segment) -> None:
    """Bytes 0..``length`` of ``src`` appended to ``dst``, never more than a chunk of them
    in memory (none where the kernel copies file to file)."""
    done = 0
    fast = hasattr(os, "copy_file_range")
    while done < length:
        want = min(length - done, COPY_CHUNK if not fast else 1 << 30)
        n = 0
        if fast:
            try:
                n = os.copy_file_range(src, dst, want, done)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                fast = False
                continue
        else:
            chunk = os.pread(src, want, done)
            write_all(dst, chunk)
            n = len(chunk)
        if n == 0:
            raise InputRejected(f"{seg.path.name} got shorter while it was forked")
        done += n


def _place_segment(seg: Segment, dst: Path, *, durable: bool) -> None:
    """A hard link to the file that was read, under whichever name it has now (a rotation
    renames segments, never writes them), else a copy of it."""
    for path in _names(seg):
        with contextlib.suppress(OSError):
            if os.stat(path, follow_symlinks=False).st_ino != seg.ino:
                continue
            os.link(path, dst, follow_symlinks=False)
            if os.stat(dst, follow_symlinks=False).st_ino == seg.ino:
                return
            os.unlink(dst)
    _copy_new(dst, seg, seg.size, durable=durable)


def _link_or_copy(src: Path, dst: Path, *, durable: bool) -> None:
    """A hard link (the files a fork shares are never written in place: rotated segments
    are only renamed), else a copy. A symbolic link is never followed."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
    else:
        return
    shutil.copyfile(src, dst, follow_symlinks=False)
    if not dst.is_symlink():
        os.chmod(dst, FILE_MODE)  # made under the umask
    if durable and not dst.is_symlink():
        fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (then False): ``renameat2`` with
    ``RENAME_NOREPLACE`` where the kernel and the file system have it, else a check and a
    rename (a plain rename may replace an empty folder: a name ``new`` has just reserved)."""
    fn = getattr(_libc(), "renameat2", None)
    if fn is not None:
        rc = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        return False
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    if not _LIBC:
        lib: ctypes.CDLL | None = None
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(None, use_errno=True)
        _LIBC.append(lib)
    return _LIBC[0]
