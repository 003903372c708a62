"""File events as a trigger only: "look at conversation X" pokes.

Correctness never depends on an event arriving: the daemon also rescans every few seconds,
and a dead watcher is restarted by :meth:`Watcher.ensure_alive`.

On Linux the watch is exactly what the protocol needs, on one inotify descriptor (watchdog's
``InotifyFD``), with no recursive walk:

* ``active/``: conversation folders that appear, move or go (``IN_CREATE``/``IN_MOVED_*``/
  ``IN_DELETE``, folders only);
* each conversation folder: ``messages.log`` closed after a write (a hand append), the
  ``.cancel`` flag and ``metadata.json`` renamed in, an ``inbox/`` folder made;
* each ``inbox/``: a file renamed in (ready at once) or closed after writing.

Opens, reads, modifications and attribute changes are never asked for, and ``processing/``,
``context/`` and ``failed/`` are not watched, so the daemon's own work (claims, state writes,
a reply's chunks) costs few events and 2,000 busy conversations do not overflow the kernel
queue. If it does overflow, no watch is lost; the watcher asks for one rescan (at most one a
second) instead of rebuilding anything. Elsewhere (macOS) watchdog's recursive observer is
used with the same mapping from paths to pokes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler

from contemplation.base.privacy import DIR_MODE
from contemplation.store.layout import (
    CANCEL_NAME,
    INBOX,
    LOG_NAME,
    METADATA_NAME,
    ignored_name,
    valid_id,
)

log = structlog.get_logger("contemplation.watcher")

# conversation id, an inbox file that arrived by rename, and whether only messages.log changed
Poke = Callable[[str, Path | None, bool], None]
RESYNC_EVERY = 1.0  # seconds between rescans asked for by overflows

# inotify(7) event bits
IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x8, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_DONT_FOLLOW, IN_ISDIR = (
    0x4000, 0x8000, 0x01000000, 0x02000000, 0x40000000,
)  # fmt: skip
_ACTIVE_MASK = IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE | IN_ONLYDIR | IN_DONT_FOLLOW
_CONV_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ONLYDIR | IN_DONT_FOLLOW
_INBOX_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW
_CONV_FILES = {LOG_NAME, CANCEL_NAME, METADATA_NAME}
# what a watch is on (its mask and its events' meaning): names of roles, not of folders
ROLE_ACTIVE, ROLE_CONV, ROLE_INBOX = "active", "conv", "inbox"


def relevant(rel: Path, event_type: str) -> bool:
    """Events that can mean new work (used for watchdog's observer; the inotify masks above
    encode the same rule). The daemon's own state writes are not among them, nor is a
    folder's own "modified" event (the entry's event is the one that matters)."""
    parts = rel.parts
    if event_type in {"opened", "closed_no_write"}:
        return False
    if len(parts) <= 2 and event_type == "modified" and parts[-1] != LOG_NAME:
        return False
    if len(parts) == 1:
        return True  # a conversation folder appeared, moved or went away
    if len(parts) == 2:
        return parts[1] in {*_CONV_FILES, INBOX}
    return len(parts) == 3 and parts[1] == INBOX and not ignored_name(parts[2])


class _Restarts:
    """A watcher whose thread can die: :meth:`ensure_alive` starts it again."""

    restarts: int = 0

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def ensure_alive(self) -> bool:
        """Restart a dead watcher; True when it had to."""
        if self.alive():
            return False
        log.warning("watcher_restarted", restarts=self.restarts + 1)
        self.stop()
        try:
            self.start()
        except OSError as exc:  # inotify limits: the rescan still finds everything
            log.error("watcher_unavailable", error=str(exc))  # noqa: TRY400 - one line
        self.restarts += 1
        return True


class _Watch:
    """What one inotify watch is: the active folder, a conversation folder or an inbox."""

    def __init__(self, owner: InotifyWatcher, role: str, conv_id: str, path: Path) -> None:
        self.owner = owner
        self.role = role
        self.conv_id = conv_id
        self.path = path
        self.wd = -1
        self.ino = -1  # the folder watched: a folder renamed over it is a new watch

    # watchdog's WatchCallback protocol (called on the reader thread)
    def on_event(self, event: Any) -> None:
        try:
            self.owner.handle(self, int(event.mask), os.fsdecode(event.name))
        except Exception:  # an exception would kill the reader thread
            log.exception("watch_handler_failed")

    def on_watch_deleted(self, wd: int) -> None:
        self.owner.forget(self)

    def on_queue_overflow(self) -> None:
        if self.role == ROLE_ACTIVE:  # once per overflow, not once per watch
            self.owner.overflowed()


class InotifyWatcher(_Restarts):
    """Linux: one inotify descriptor, three kinds of watches (see the module docstring)."""

    def __init__(self, active: Path, poke: Poke, resync: Callable[[], None]) -> None:
        self.active = active
        self.poke = poke
        self.resync = resync
        self._fd: Any = None
        self._lock = threading.Lock()
        self._watched: dict[tuple[str, str], _Watch] = {}  # (role, conv id) → watch
        self._last_resync = 0.0
        self.overflows = 0
        self.restarts = 0

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        from watchdog.observers.inotify_c import InotifyFD

        self.active.mkdir(DIR_MODE, parents=True, exist_ok=True)
        fd = InotifyFD()  # our own instance: its reader thread serves only these watches
        fd.daemon = True
        fd.start()
        self._fd = fd
        self._add(ROLE_ACTIVE, "", self.active)
        self.watch_all()

    def alive(self) -> bool:
        return self._fd is not None and self._fd.is_alive()

    def stop(self) -> None:
        fd, self._fd = self._fd, None
        with self._lock:
            self._watched.clear()
        if fd is not None:
            fd.stop()
            if fd.is_alive():
                fd.join(timeout=2)

    # -- watches ------------------------------------------------------------------------

    def watch_all(self) -> int:
        """Watch every conversation folder not watched yet (start-up, and after a rescan
        found one the events missed). Returns how many were added."""
        added = 0
        try:
            with os.scandir(self.active) as it:
                names = [e.name for e in it if valid_id(e.name) and e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            log.warning("watch_scan_failed", error=str(exc))
            return 0
        for name in names:
            added += self.watch_conv(name)
        return added

    def watch_conv(self, conv_id: str) -> int:
        d = self.active / conv_id
        return self._add(ROLE_CONV, conv_id, d) + self._add(ROLE_INBOX, conv_id, d / INBOX)

    def unwatch_conv(self, conv_id: str) -> None:
        """A folder moved away (archived): its watches follow the inode, so drop them."""
        with self._lock:
            gone = [
                w for r in (ROLE_CONV, ROLE_INBOX) if (w := self._watched.pop((r, conv_id), None))
            ]
        fd = self._fd
        if fd is not None and gone:
            fd.remove_callbacks([(w.wd, id(w)) for w in gone if w.wd >= 0])

    def _add(self, role: str, conv_id: str, path: Path) -> int:
        fd = self._fd
        if fd is None:
            return 0
        try:
            ino = os.stat(path, follow_symlinks=False).st_ino
        except OSError:
            return 0  # gone already: the rescan covers it
        with self._lock:
            old = self._watched.get((role, conv_id))
            if old is not None and old.ino == ino:
                return 0
            # a new folder under a watched name (``new`` renames its finished folder over
            # the empty reservation): watch it; the old watch's IN_IGNORED arrives later
            # and forget() leaves this one alone
            watch = self._watched[(role, conv_id)] = _Watch(self, role, conv_id, path)
            watch.ino = ino
        mask = {ROLE_ACTIVE: _ACTIVE_MASK, ROLE_CONV: _CONV_MASK, ROLE_INBOX: _INBOX_MASK}[role]
        try:
            watch.wd = fd.add_callback(os.fsencode(path), mask, watch, id(watch))
        except OSError:
            with self._lock:
                self._watched.pop((role, conv_id), None)
            return 0  # gone already, or not a folder: the rescan covers it
        return 1

    def forget(self, watch: _Watch) -> None:
        with self._lock:
            if self._watched.get((watch.role, watch.conv_id)) is watch:
                del self._watched[(watch.role, watch.conv_id)]

    @property
    def watch_count(self) -> int:
        return len(self._watched)

    # -- events (reader thread) ---------------------------------------------------------

    def handle(self, w: _Watch, mask: int, name: str) -> None:
        if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
            return
        if w.role == ROLE_ACTIVE:
            if not (mask & IN_ISDIR) or not valid_id(name):
                return
            if mask & (IN_CREATE | IN_MOVED_TO):
                self.watch_conv(name)
            elif mask & IN_MOVED_FROM:
                self.unwatch_conv(name)
            self.poke(name, None, False)
        elif w.role == ROLE_CONV:
            if name == INBOX and mask & IN_ISDIR:
                self._add(ROLE_INBOX, w.conv_id, w.path / INBOX)
                self.poke(w.conv_id, None, False)
            elif name in _CONV_FILES and not mask & IN_ISDIR:
                self.poke(w.conv_id, None, name == LOG_NAME)
        elif not ignored_name(name) and (not mask & IN_ISDIR or mask & IN_MOVED_TO):
            # an inbox entry: a file, or a folder message renamed in whole
            renamed_in = bool(mask & IN_MOVED_TO)
            self.poke(w.conv_id, w.path / name if renamed_in else None, False)

    def overflowed(self) -> None:
        """Events were lost (never watches): ask for one rescan, at most one a second."""
        self.overflows += 1
        now = time.monotonic()
        if now - self._last_resync >= RESYNC_EVERY:
            self._last_resync = now
            log.warning("events_lost", overflows=self.overflows, action="rescan")
            self.resync()


class _Handler(FileSystemEventHandler):
    def __init__(self, active: Path, poke: Poke) -> None:
        self.active = active
        self.poke = poke

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            dest = event.dest_path if event.event_type == "moved" else ""
            for raw in (event.src_path, dest):
                if not raw:
                    continue
                path = raw if isinstance(raw, str) else raw.decode(errors="replace")
                try:
                    rel = Path(path).relative_to(self.active)
                except ValueError:
                    continue
                if (
                    not rel.parts
                    or not valid_id(rel.parts[0])
                    or not relevant(rel, event.event_type)
                ):
                    continue
                renamed_in = bool(dest) and path == dest and len(rel.parts) == 3
                log_only = rel.parts[1:] == (LOG_NAME,)
                self.poke(rel.parts[0], Path(path) if renamed_in else None, log_only)
        except Exception:  # a handler exception would kill the observer thread
            log.exception("watch_handler_failed")


class ObserverWatcher(_Restarts):
    """Elsewhere: watchdog's recursive observer (FSEvents on macOS) mapped by :func:`relevant`."""

    def __init__(self, active: Path, poke: Poke, resync: Callable[[], None]) -> None:
        self.active = active
        self.poke = poke
        self._observer: Any = None
        self.restarts = 0

    def start(self) -> None:
        from watchdog.observers import Observer

        self.active.mkdir(DIR_MODE, parents=True, exist_ok=True)
        obs = Observer()
        obs.schedule(_Handler(self.active, self.poke), str(self.active), recursive=True)
        obs.daemon = True
        obs.start()
        self._observer = obs

    def alive(self) -> bool:
        return self._observer is not None and self._observer.is_alive()

    def watch_all(self) -> int:
        return 0  # recursive: new folders are watched by the observer itself

    def stop(self) -> None:
        obs, self._observer = self._observer, None
        if obs is not None:
            obs.stop()
            if obs.is_alive():
                obs.join(timeout=2)


class Watcher(Protocol):
    def start(self) -> None: ...

    def alive(self) -> bool: ...

    def ensure_alive(self) -> bool: ...

    def watch_all(self) -> int: ...

    def stop(self) -> None: ...


def make_watcher(active: Path, poke: Poke, resync: Callable[[], None]) -> Watcher:
    """The watcher for this platform (inotify on Linux, watchdog's observer elsewhere)."""
    cls = InotifyWatcher if sys.platform.startswith("linux") else ObserverWatcher
    return cls(active, poke, resync)
