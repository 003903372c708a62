"""The copies of the files messages carry: kept in ``<conv>/attachments/`` before the block
that names them is written, and dropped into the inbox as one folder message.

Crash safety: each copy is written to a dot-named temp file, fsynced and renamed, so a file
named in the log is always whole; a kill during a copy leaves only a temp file, which the
next take of the same (still claimed) folder removes before it copies again. The names are
a pure function of the block and the content, so taking a folder twice keeps one copy.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from contemplation.base.privacy import DIR_MODE, FILE_MODE
from contemplation.base.testing import armed, crashpoint
from contemplation.errors import InputRejected
from contemplation.store.attachments import FOLDER, MESSAGE_NAMES, Attachment
from contemplation.store.layout import Conv, ignored_name
from contemplation.writer.files import fsync_dir, staging_name, write_all


def attachments_dir(conv: Conv) -> Path:
    return conv.dir / FOLDER


def store(conv: Conv, block: str, files: Sequence[Attachment], *, durable: bool = True) -> None:
    """Keep each file as ``attachments/<block>-<sha256><ext>`` (whole, or not at all)."""
    if not files:
        return
    folder = attachments_dir(conv)
    folder.mkdir(DIR_MODE, exist_ok=True)
    _remove_temps(folder, block)
    for a in files:
        dest = folder / a.stored_name(block)
        with contextlib.suppress(FileNotFoundError):
            if dest.stat(follow_symlinks=False).st_size == len(a.data):
                continue  # kept by an earlier take of this message (a crash after the copy)
        _copy(dest, a.data, durable=durable)
    if durable:
        fsync_dir(folder)


def _copy(dest: Path, data: bytes, *, durable: bool) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp.{os.getpid()}.{secrets.token_hex(3)}")
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE
    )
    try:
        if armed("attachment_copy"):
            half = len(data) // 2
            write_all(fd, data[:half])
            crashpoint("attachment_copy")  # half a file, under a temp name
            write_all(fd, data[half:])
        else:
            write_all(fd, data)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.rename(tmp, dest)
    except BaseException:  # a folder that cannot grow (a full disk): no temp file left
        tmp.unlink(missing_ok=True)
        raise


def _remove_temps(folder: Path, block: str) -> None:
    """Temp files of an earlier take of this block (killed during a copy)."""
    with os.scandir(folder) as it:
        for e in it:
            if e.name.startswith(f".{block}-") and ".tmp." in e.name:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)


def drop_folder_message(
    conv: Conv, text: str, files: Sequence[Attachment], *, name: str | None = None
) -> Path:
    """Maildir delivery of a message with files (see
    :func:`contemplation.store.attachments.read_paths`): a dot-folder in ``inbox/`` gets
    ``message.txt`` and each file (each fsynced), then is renamed into place whole."""
    conv.inbox.mkdir(DIR_MODE, parents=True, exist_ok=True)
    final = name or f"{time.time_ns()}-{secrets.token_hex(4)}.msg"
    if ignored_name(final) or "/" in final or final in {".", ".."}:
        raise InputRejected(f"not a usable inbox name: {final!r}")
    staging = conv.inbox / staging_name(final)
    staging.mkdir(DIR_MODE)
    try:
        leaves = [(MESSAGE_NAMES[0], text.encode("utf-8")), *((a.name, a.data) for a in files)]
        for leaf, data in leaves:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(staging / leaf, flags, FILE_MODE)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(staging)
        os.rename(staging, conv.inbox / final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_dir(conv.inbox)
    return conv.inbox / final
