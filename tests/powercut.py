"""A simulated power cut (test-only): only what was fsynced survives, file contents and
directory entries alike (as LazyFS does for Jepsen, plus the entries).

Two halves:

* in the process that writes (``python -m tests.powercut JOURNAL -- <contemplation args>``):
  :func:`install` wraps ``os.fsync``, ``os.fdatasync`` and the writer's ``syncfs`` so that
  each one appends what it made durable to the journal: a file's bytes (by inode), a folder's
  entries (name -> inode), or, for ``syncfs``, everything under the home;
* in the harness, once that process is dead (SIGKILL at a crash point) or has exited (a cut
  right after it answered): :func:`cut` rolls the home back, in place, to ``baseline`` (what
  was on disk before the process began, taken as durable) plus the journal. A file's inode is
  kept wherever its name survives (state.json records the log's inode); a rename that no fsync
  of its folder followed is undone, a file created and never fsynced is empty or gone. A
  folder keeps one name: once its new parent is durable, its old parent no longer holds it
  (see :func:`_one_name`).

The search index (``.index.sqlite3*``) is left as it is: SQLite makes its own writes durable
(and the index is derived: it must agree with the folders whatever they are).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import runpy
import shutil
import stat
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_KEEP = ".index.sqlite3"  # names starting so are SQLite's: never rolled back
_GETVERSION = 0x80087601  # FS_IOC_GETVERSION: the inode's generation (ext4), told reuse apart


def ident_fd(fd: int) -> str:
    """An inode that is not taken for another that reused its number: ``<ino>-<generation>``
    (the generation is 0 where the file system does not say it)."""
    try:
        gen = struct.unpack("q", fcntl.ioctl(fd, _GETVERSION, b"\0" * 8))[0]
    except OSError:
        gen = 0
    return f"{os.fstat(fd).st_ino}-{gen}"


def ident(path: Path | str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        return ident_fd(fd)
    finally:
        os.close(fd)


@dataclass
class Image:
    """A tree by inode: each folder's entries and each file's bytes."""

    root: str
    dirs: dict[str, dict[str, str]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)


def snapshot(root: Path) -> Image:
    """The tree under ``root`` as it is now."""
    img = Image(root=ident(root))
    _walk(root, img)
    return img


def _key(path: Path | str) -> str:
    """A symlink has no descriptor to ask: its inode number stands alone."""
    st = os.lstat(path)
    return f"{st.st_ino}-link" if stat.S_ISLNK(st.st_mode) else ident(path)


def _walk(path: Path, img: Image) -> str:
    st = os.lstat(path)
    key = _key(path)
    if stat.S_ISDIR(st.st_mode):
        entries: dict[str, str] = {}
        for e in os.scandir(path):
            if not e.name.startswith(_KEEP):
                try:
                    entries[e.name] = _walk(Path(e.path), img)
                except FileNotFoundError:  # removed meanwhile (another thread's write)
                    continue
        img.dirs[key] = entries
    elif stat.S_ISLNK(st.st_mode):
        img.links[key] = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            img.files[key] = f.read()
    return key


# --------------------------------------------------------------------------- the writer's side

_lock = threading.Lock()


def install(journal: Path, root: Path) -> None:
    """Journal every fsync, fdatasync and syncfs of this process from now on."""
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    calls = iter(range(1 << 62))

    def note(*records: dict[str, Any]) -> None:
        """One call's records, in one write: a cut falls between calls, never inside one."""
        call = f"{os.getpid()}.{next(calls)}"
        line = "".join(json.dumps({**r, "call": call}) + "\n" for r in records).encode()
        with _lock:
            fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

    def synced(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            entries: dict[str, str] = {}
            subdirs: list[str] = []
            for e in os.scandir(f"/proc/self/fd/{fd}"):
                if e.name.startswith(_KEEP):
                    continue
                try:
                    entries[e.name] = _key(e.path)
                except OSError:  # gone meanwhile (another thread): not in this image
                    continue
                if e.is_dir(follow_symlinks=False):
                    subdirs.append(entries[e.name])
            note({"dir": ident_fd(fd), "entries": entries, "subdirs": subdirs})
        elif stat.S_ISREG(st.st_mode):
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                data = f.read()
            note({"file": ident_fd(fd), "data": base64.b64encode(data).decode()})

    def fsync(fd: Any) -> None:
        real_fsync(fd)
        synced(fd if isinstance(fd, int) else fd.fileno())

    def fdatasync(fd: Any) -> None:
        real_fdatasync(fd)
        synced(fd if isinstance(fd, int) else fd.fileno())

    os.fsync = fsync
    os.fdatasync = fdatasync

    from contemplation.writer import durable

    real_syncfs = durable._syncfs_fn()  # libc's, loaded now: the wrapper below replaces it
    if real_syncfs is not None:

        def syncfs(fd: int) -> int:
            rc = real_syncfs(fd)
            img = snapshot(root)
            note(
                *({"dir": ino, "entries": entries, "subdirs": list(img.dirs)}
                  for ino, entries in img.dirs.items()),
                *({"file": ino, "data": base64.b64encode(data).decode()}
                  for ino, data in img.files.items()),
            )  # fmt: skip
            return rc

        durable._syncfs_fn = lambda: syncfs  # type: ignore[assignment]


def main() -> None:
    """``python -m tests.powercut JOURNAL -- ARGS``: the contemplation command ARGS, with its
    durable points journaled."""
    journal, args = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
    install(journal, Path(os.environ["CONTEMPLATION_HOME"]))
    sys.argv = ["contemplation", *args]
    runpy.run_module("contemplation", run_name="__main__", alter_sys=True)


# --------------------------------------------------------------------------- the cut


def _records(journal: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line the kill cut: that point was not passed
                continue
    return out


def calls(journal: Path) -> int:
    """How many fsync, fdatasync and syncfs calls the journal holds."""
    return len({r["call"] for r in _records(journal)})


def durable_image(baseline: Image, journal: Path, upto: int | None = None) -> Image:
    """``baseline`` with every durable point of the journal applied, in order; with
    ``upto``, only those of its first ``upto`` calls (a power cut before the next one)."""
    img = Image(
        root=baseline.root,
        dirs=dict(baseline.dirs),
        files=dict(baseline.files),
        links=dict(baseline.links),
    )
    seen: set[str] = set()
    for rec in _records(journal):
        if upto is not None and rec["call"] not in seen:
            if len(seen) == upto:
                break
            seen.add(rec["call"])
        if "dir" in rec:
            img.dirs[rec["dir"]] = rec["entries"]
            for sub in rec.get("subdirs", ()):  # made, never fsynced itself: empty
                img.dirs.setdefault(sub, {})
            _one_name(img, rec["dir"])
        else:
            img.files[rec["file"]] = base64.b64decode(rec["data"])
    return img


def _one_name(img: Image, parent: str) -> None:
    """A folder has one name: one that ``parent`` now durably holds is gone from any other
    folder (a folder's rename is one journal transaction on ext4, XFS, btrfs and APFS, and no
    POSIX file system gives a folder two names; a file may have two, and keeps them)."""
    moved = {child for child in img.dirs[parent].values() if child in img.dirs}
    if not moved:
        return
    for ino, entries in img.dirs.items():
        if ino != parent and not moved.isdisjoint(entries.values()):
            img.dirs[ino] = {k: v for k, v in entries.items() if v not in moved}


def cut(root: Path, baseline: Image, journal: Path, upto: int | None = None) -> None:
    """Roll the tree under ``root`` back to what the power cut leaves (see the module): after
    the journal's first ``upto`` calls, or all of them."""
    img = durable_image(baseline, journal, upto)
    stage = root.parent / f".{root.name}.powercut"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    _stage(root, stage)
    _build(root, img.root, img, stage, {})
    shutil.rmtree(stage)


def _stage(path: Path, stage: Path) -> None:
    """Move every entry under ``path`` into ``stage``, named by its inode (one name kept per
    inode; folders emptied first, so each is moved alone)."""
    for e in list(os.scandir(path)):
        if e.name.startswith(_KEEP):
            continue
        p = Path(e.path)
        if e.is_dir(follow_symlinks=False):
            _stage(p, stage)
        dest = stage / _key(p)
        if os.path.lexists(dest):
            p.unlink()  # a second name of a file already staged
        else:
            os.rename(p, dest)


def _build(path: Path, ino: str, img: Image, stage: Path, used: dict[str, Path]) -> None:
    """Put back the entries of folder ``ino`` at ``path`` (``used``: the inodes in place).
    An inode staged is moved back (its bytes set to the durable ones); one gone is made
    anew."""
    for name, child in img.dirs.get(ino, {}).items():
        p, staged = path / name, stage / child
        if child in img.dirs:
            if staged.exists() and child not in used:
                os.rename(staged, p)
            else:
                p.mkdir()
            used[child] = p
            _build(p, child, img, stage, used)
        elif child in img.links:
            os.symlink(img.links[child], p)
        elif child in used:  # a hard link: the file is in place under another name
            os.link(used[child], p)
        else:
            data = img.files.get(child, b"")
            if os.path.lexists(staged):
                os.rename(staged, p)
                with open(p, "r+b") as f:  # the same inode, its durable bytes
                    if f.read() != data:
                        f.seek(0)
                        f.truncate()
                        f.write(data)
            else:
                p.write_bytes(data)
            used[child] = p


if __name__ == "__main__":
    main()
