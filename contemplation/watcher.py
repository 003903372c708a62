"""watchdog as a trigger only: file events become "look at conversation X" pokes.

One recursive watch on ``<home>/active``. Handlers only map a path to a conversation id and
hand it to a thread-safe callback; correctness never depends on an event arriving (the daemon
also rescans every few seconds), and a dead observer is restarted by :meth:`Watcher.ensure_alive`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from contemplation.layout import ignored_name, valid_id

log = structlog.get_logger("contemplation.watcher")

# watchdog holds an inotify IN_MOVED_FROM for up to 0.5 s to pair it with its IN_MOVED_TO, and
# its reader sleeps that whole time whenever it sees the MOVED_FROM first, even if the pair
# arrives a microsecond later. Every atomic write (tmp + rename) in the tree then delays all
# events behind it (measured: ~400 ms pickup). The kernel queues both halves of a rename
# together, so a few milliseconds pair them; an unpaired move still reaches us as
# deleted + created, and the rescan covers anything else.
MOVE_PAIRING_DELAY = 0.003
try:
    from watchdog.observers.inotify_move_event_grouper import InotifyMoveEventGrouper

    InotifyMoveEventGrouper.delay = MOVE_PAIRING_DELAY
except ImportError:  # pragma: no cover - not Linux
    pass

# conversation id, an inbox file that arrived by rename, and whether only messages.log changed
Poke = Callable[[str, Path | None, bool], None]


class _Handler(FileSystemEventHandler):
    def __init__(self, active: Path, poke: Poke) -> None:
        self.active = active
        self.poke = poke

    def _conv_of(self, path: str) -> tuple[str, Path] | None:
        try:
            rel = Path(path).relative_to(self.active)
        except ValueError:
            return None
        if not rel.parts or not valid_id(rel.parts[0]):
            return None
        return rel.parts[0], rel

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            if event.event_type in {"opened", "closed_no_write"}:
                return
            dest = event.dest_path if event.event_type == "moved" else ""
            for raw in (event.src_path, dest):
                if not raw:
                    continue
                path = raw if isinstance(raw, str) else raw.decode(errors="replace")
                hit = self._conv_of(path)
                if hit is None:
                    continue
                conv_id, rel = hit
                if not relevant(rel, event.event_type):
                    continue
                renamed_in = bool(dest) and path == dest and len(rel.parts) == 3
                log_only = rel.parts[1:] == ("messages.log",)
                self.poke(conv_id, Path(path) if renamed_in else None, log_only)
        except Exception:  # a handler exception would kill the observer thread
            log.exception("watch_handler_failed")


def relevant(rel: Path, event_type: str) -> bool:
    """Events that can mean new work; the daemon's own state writes are not among them.

    A folder's own "modified" event only says an entry in it changed; the entry's event is
    the one that matters, so those are dropped.
    """
    parts = rel.parts
    if len(parts) <= 2 and event_type == "modified" and parts[-1] != "messages.log":
        return False
    if len(parts) == 1:
        return True  # a conversation folder appeared, moved or went away
    if len(parts) == 2:
        return parts[1] in {"messages.log", ".cancel", "metadata.json", "inbox"}
    return len(parts) == 3 and parts[1] == "inbox" and not ignored_name(parts[2])


class Watcher:
    def __init__(self, active: Path, poke: Poke) -> None:
        self.active = active
        self.poke = poke
        self._observer: Observer | None = None  # type: ignore[valid-type]
        self.restarts = 0

    def start(self) -> None:
        self.active.mkdir(parents=True, exist_ok=True)
        obs = Observer()
        obs.schedule(_Handler(self.active, self.poke), str(self.active), recursive=True)
        obs.daemon = True
        obs.start()
        self._observer = obs

    def alive(self) -> bool:
        return self._observer is not None and self._observer.is_alive()

    def ensure_alive(self) -> bool:
        """Restart a dead observer; True when it had to."""
        if self.alive():
            return False
        log.warning("watcher_restarted", restarts=self.restarts + 1)
        self.stop()
        try:
            self.start()
        except OSError as exc:  # inotify limits: the rescan still finds everything
            log.error("watcher_unavailable", error=str(exc))  # noqa: TRY400 - expected, one line
        self.restarts += 1
        return True

    def stop(self) -> None:
        obs, self._observer = self._observer, None
        if obs is not None:
            obs.stop()
            if obs.is_alive():
                obs.join(timeout=2)
