"""The watcher's choices: which file events poke which conversation, with which arguments.

``relevant()`` (the rule watchdog's observer uses) and ``InotifyWatcher.handle`` (the same
rule on raw inotify masks) are checked case by case; then the inotify watcher runs for real
on a temporary folder, driven by the writer's own operations (new, drop, cancel, archive)
and the daemon's noise (state writes, claims, context files) that must poke nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.daemon import watcher as w
from contemplation.daemon.watcher import InotifyWatcher, relevant
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import (
    archive,
    atomic_write_json,
    claim,
    drop_message,
    new_conversation,
    request_cancel,
    write_context_file,
)

PokeArgs = tuple[str, Path | None, bool]

# --------------------------------------------------------------------------- relevant()

RELEVANT = [
    # a conversation folder appears, moves or goes; its own "modified" is not news
    ("c1", "created", True),
    ("c1", "moved", True),
    ("c1", "deleted", True),
    ("c1", "modified", False),
    ("c1", "opened", False),
    # files of the conversation folder: the log, the cancel flag, the metadata, the inbox
    ("c1/messages.log", "modified", True),
    ("c1/messages.log", "closed", True),
    ("c1/messages.log", "opened", False),
    ("c1/messages.log", "closed_no_write", False),
    ("c1/.cancel", "created", True),
    ("c1/.cancel", "moved", True),
    ("c1/.cancel", "modified", False),
    ("c1/metadata.json", "moved", True),
    ("c1/inbox", "created", True),
    ("c1/inbox", "modified", False),
    # the daemon's own files and folders
    ("c1/state.json", "moved", False),
    ("c1/state.json", "closed", False),
    ("c1/.state.json.tmp.1.ab", "created", False),
    ("c1/.lock", "closed", False),
    ("c1/processing", "created", False),
    ("c1/context", "created", False),
    ("c1/failed", "created", False),
    ("c1/processing/q.txt", "moved", False),
    ("c1/context/plan.md", "closed", False),
    ("c1/failed/q.txt", "created", False),
    # inbox entries, but not what is still being written
    ("c1/inbox/q.txt", "created", True),
    ("c1/inbox/q.txt", "moved", True),
    ("c1/inbox/q.txt", "closed", True),
    ("c1/inbox/q.txt", "modified", True),
    ("c1/inbox/q.txt", "opened", False),
    ("c1/inbox/q.txt", "closed_no_write", False),
    ("c1/inbox/.q.txt.tmp", "created", False),
    ("c1/inbox/q.txt.tmp", "closed", False),
    ("c1/inbox/q.txt.part", "closed", False),
    ("c1/inbox/q.txt~", "closed", False),
    ("c1/inbox/.q.txt.swp", "modified", False),
    ("c1/inbox/q.swp", "modified", False),
    ("c1/inbox/#q.txt#", "closed", False),
    ("c1/inbox/.#q.txt", "created", False),
    ("c1/inbox/sub/q.txt", "created", False),  # nothing deeper than the inbox
]


@pytest.mark.parametrize(("rel", "event", "expected"), RELEVANT)
def test_relevant(rel: str, event: str, expected: bool) -> None:
    assert relevant(Path(rel), event) is expected


# --------------------------------------------------------------------------- handle()


class Pokes:
    """The poke callback: records calls from the reader thread; tests wait on a condition."""

    def __init__(self) -> None:
        self.got: list[PokeArgs] = []
        self._cond = threading.Condition()

    def __call__(self, conv_id: str, ready: Path | None, log_only: bool) -> None:
        with self._cond:
            self.got.append((conv_id, ready, log_only))
            self._cond.notify_all()

    def wait(self, pred: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
        with self._cond:
            if not self._cond.wait_for(pred, timeout):
                raise AssertionError(f"timed out waiting for {what}; pokes: {self.got}")

    def wait_for(self, poke: PokeArgs) -> None:
        self.wait(lambda: poke in self.got, f"poke {poke}")

    def take(self) -> list[PokeArgs]:
        with self._cond:
            got, self.got = self.got, []
            return got


def no_resync() -> None:
    raise AssertionError("no rescan expected")


ACT, CONV, INBOX = "active", "conv", "inbox"
DIR = w.IN_ISDIR
ROOT = Path("/home/active")  # handle() only joins paths; nothing is read
Q = ROOT / "c1" / "inbox" / "q.txt"

HANDLE = [
    # the active folder: conversation folders only, by a valid name
    (ACT, w.IN_CREATE | DIR, "c1", [("c1", None, False)]),
    (ACT, w.IN_MOVED_TO | DIR, "c1", [("c1", None, False)]),
    (ACT, w.IN_MOVED_FROM | DIR, "c1", [("c1", None, False)]),
    (ACT, w.IN_DELETE | DIR, "c1", [("c1", None, False)]),
    (ACT, w.IN_CREATE, "c1", []),  # a file, not a conversation
    (ACT, w.IN_CREATE | DIR, ".new-12-ab", []),  # new's staging folder
    (ACT, w.IN_MOVED_TO | DIR, "bad name", []),
    # a conversation folder
    (CONV, w.IN_CLOSE_WRITE, "messages.log", [("c1", None, True)]),
    (CONV, w.IN_MOVED_TO, ".cancel", [("c1", None, False)]),
    (CONV, w.IN_CREATE, ".cancel", [("c1", None, False)]),
    (CONV, w.IN_MOVED_TO, "metadata.json", [("c1", None, False)]),
    (CONV, w.IN_CREATE | DIR, "inbox", [("c1", None, False)]),
    (CONV, w.IN_MOVED_TO, "state.json", []),
    (CONV, w.IN_CREATE, ".state.json.tmp.1.ab", []),
    (CONV, w.IN_CLOSE_WRITE, ".lock", []),
    (CONV, w.IN_CREATE | DIR, "processing", []),
    (CONV, w.IN_CREATE | DIR, "context", []),
    (CONV, w.IN_CREATE, "inbox", []),  # a file called inbox is not the inbox
    (CONV, w.IN_CREATE | DIR, "messages.log", []),
    # an inbox: renamed in (ready at once) or written in place (settles first)
    (INBOX, w.IN_MOVED_TO, "q.txt", [("c1", Q, False)]),
    (INBOX, w.IN_CLOSE_WRITE, "q.txt", [("c1", None, False)]),
    (INBOX, w.IN_CLOSE_WRITE, ".q.txt.tmp", []),
    (INBOX, w.IN_MOVED_TO, "q.txt~", []),
    (INBOX, w.IN_CLOSE_WRITE, "#q.txt#", []),
    # a folder renamed in is one message with files (ready at once); a dot-folder is staging
    (INBOX, w.IN_MOVED_TO | DIR, "sub", [("c1", ROOT / "c1" / "inbox" / "sub", False)]),
    (INBOX, w.IN_MOVED_TO | DIR, ".sub.tmp", []),
    # the watch itself going away is never a poke
    (ACT, w.IN_IGNORED, "", []),
    (CONV, w.IN_DELETE_SELF, "", []),
    (CONV, w.IN_MOVE_SELF, "", []),
    (INBOX, w.IN_IGNORED, "", []),
]


@pytest.mark.parametrize(("role", "mask", "name", "expected"), HANDLE)
def test_handle(role: str, mask: int, name: str, expected: list[PokeArgs]) -> None:
    pokes = Pokes()
    watcher = InotifyWatcher(ROOT, pokes, no_resync)  # not started: no watches are made
    path = {ACT: ROOT, CONV: ROOT / "c1", INBOX: ROOT / "c1" / "inbox"}[role]
    watch = w._Watch(watcher, role, "" if role == ACT else "c1", path)
    watcher.handle(watch, mask, name)
    assert pokes.got == expected


def test_an_overflow_asks_for_one_rescan_a_second() -> None:
    rescans: list[int] = []
    watcher = InotifyWatcher(ROOT, Pokes(), lambda: rescans.append(1))
    for _ in range(5):
        watcher.overflowed()
    assert watcher.overflows == 5
    assert rescans == [1]
    watcher._last_resync -= w.RESYNC_EVERY  # a second later
    watcher.overflowed()
    assert rescans == [1, 1]


# --------------------------------------------------------------------------- real inotify

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


@pytest.fixture
def watched(home: Home) -> Iterator[tuple[InotifyWatcher, Pokes]]:
    pokes = Pokes()
    watcher = InotifyWatcher(home.active, pokes, no_resync)
    watcher.start()
    yield watcher, pokes
    watcher.stop()


def make_conv(home: Home, watcher: InotifyWatcher, pokes: Pokes, topic: str) -> Conv:
    """A conversation made the way ``new`` makes it, once its folder and inbox are watched."""
    before = watcher.watch_count
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="m", backend="ollama"
    )
    pokes.wait(lambda: watcher.watch_count == before + 2, f"{conv.id} to be watched")
    pokes.wait_for((conv.id, None, False))
    return conv


def barrier(conv: Conv, pokes: Pokes) -> list[PokeArgs]:
    """Events on one inotify descriptor arrive in order: once a cancel flag's poke is here,
    every event before it has been handled. Returns the pokes up to and including it."""
    request_cancel(conv)
    pokes.wait_for((conv.id, None, False))
    return pokes.take()


@linux_only
def test_a_new_conversation_is_watched_and_its_inputs_poke(
    home: Home, watched: tuple[InotifyWatcher, Pokes]
) -> None:
    watcher, pokes = watched
    assert watcher.watch_count == 1  # the active folder
    conv = make_conv(home, watcher, pokes, "hello")
    assert {p[0] for p in pokes.take()} == {conv.id}

    q = drop_message(conv, "hi", name="q1.txt")  # written under a dot-name, renamed in
    pokes.wait_for((conv.id, q, False))
    (conv.inbox / "q2.txt").write_text("written in place")  # settles before it is taken
    pokes.wait_for((conv.id, None, False))
    assert pokes.take() == [(conv.id, q, False), (conv.id, None, False)]

    with conv.log.open("ab") as f:  # an append by hand (or the daemon's own)
        f.write(b"=== CLAUDE -> OLLAMA [2026-01-19 10:00:00] ===\nby hand\n")
    pokes.wait_for((conv.id, None, True))
    assert pokes.take() == [(conv.id, None, True)]

    request_cancel(conv)
    pokes.wait_for((conv.id, None, False))
    assert pokes.take() == [(conv.id, None, False)]


@linux_only
def test_the_daemons_own_work_pokes_nothing(
    home: Home, watched: tuple[InotifyWatcher, Pokes]
) -> None:
    watcher, pokes = watched
    conv = make_conv(home, watcher, pokes, "noise")
    pokes.take()
    q = conv.inbox / "q.txt"
    q.write_text("hello")
    pokes.wait_for((conv.id, None, False))
    pokes.take()

    claim(conv, q)  # renamed out of the inbox into processing/
    atomic_write_json(conv.state, {"status": "generating"}, durable=False)
    write_context_file(conv, "plan.md", b"context", durable=False)
    (conv.dir / "failed").mkdir()
    (conv.dir / "failed" / "x.txt").write_text("kept")
    (conv.inbox / ".q2.txt.tmp").write_text("still being written")
    (conv.inbox / "notes.txt~").write_text("editor backup")
    (conv.dir / ".lock").write_text("")
    conv.log.read_bytes()  # reads and opens are not asked for
    (home.active / "stray.txt").write_text("a file is not a conversation")
    (home.active / ".hidden").mkdir()

    assert barrier(conv, pokes) == [(conv.id, None, False)]  # only the cancel flag's


@linux_only
def test_an_archived_conversation_is_poked_once_and_no_longer_watched(
    home: Home, watched: tuple[InotifyWatcher, Pokes]
) -> None:
    watcher, pokes = watched
    gone = make_conv(home, watcher, pokes, "gone")
    stays = make_conv(home, watcher, pokes, "stays")
    assert watcher.watch_count == 5
    # a poke no other event makes (the message's path): once it is here, every poke of making
    # the two has come (a late one would meet the barrier below in the cancel flag's place)
    settled = drop_message(stays, "settle", name="settle.txt")
    pokes.wait_for((stays.id, settled, False))
    pokes.take()

    moved = archive(home, gone)
    pokes.wait_for((gone.id, None, False))
    assert watcher.watch_count == 3  # the active folder and the one left

    drop_message(moved, "too late", name="late.txt")  # in completed/: not ours any more
    (moved.dir / ".cancel").write_text("now")
    assert barrier(stays, pokes) == [(gone.id, None, False), (stays.id, None, False)]


@linux_only
def test_an_inbox_made_after_the_folder_is_watched_too(
    home: Home, watched: tuple[InotifyWatcher, Pokes]
) -> None:
    watcher, pokes = watched
    d = home.active / "by-hand"
    d.mkdir()
    pokes.wait_for(("by-hand", None, False))
    assert watcher.watch_count == 2  # the folder; no inbox yet
    pokes.take()
    (d / "inbox").mkdir()
    pokes.wait_for(("by-hand", None, False))
    assert watcher.watch_count == 3
    (d / "inbox" / "tmp").write_text("hi")
    os.rename(d / "inbox" / "tmp", d / "inbox" / "q.txt")
    pokes.wait_for(("by-hand", d / "inbox" / "q.txt", False))


@linux_only
def test_a_dead_watcher_is_restarted_and_pokes_again(
    home: Home, watched: tuple[InotifyWatcher, Pokes]
) -> None:
    watcher, pokes = watched
    conv = make_conv(home, watcher, pokes, "revived")
    assert watcher.ensure_alive() is False
    watcher._fd.stop()  # the reader thread dies
    watcher._fd.join(timeout=5)
    assert not watcher.alive()
    assert watcher.ensure_alive() is True and watcher.restarts == 1
    assert watcher.alive() and watcher.watch_count == 3  # existing folders watched again
    pokes.take()
    q = drop_message(conv, "after the restart", name="q.txt")
    pokes.wait_for((conv.id, q, False))
