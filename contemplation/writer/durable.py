"""Durable points, and the group committer that makes many conversations' points durable at once.

A write that must survive a power loss is written as *steps*: a generator that does its file
work and yields a :class:`Durable` wherever the files it names must be on disk before it goes
on (a block before the state that counts it, a temp file before its rename, a rename before
the claimed file is removed). The order of every write is fixed by its own code; only *how*
each point is made durable varies:

* :func:`run_now` drives the steps here, with one ``fsync`` per file and folder;
* :class:`GroupCommitter` drives the steps of many conversations on one thread, in batches:
  each round of points is made durable together, by one ``syncfs`` of the file system when
  the batch holds two or more (one journal commit instead of three ``fsync`` calls per
  write), else by ``fsync`` as above. A point is never passed before it is durable, so every
  crash guarantee of the writes is unchanged.

``syncfs`` writes back everything dirty on that file system, other programs' data included:
a batch waits for that too. Single writes (a turn on an otherwise idle daemon) never use it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from contemplation.base.testing import COMMIT_LAG

if TYPE_CHECKING:  # asyncio loads with an event loop: a read command that imports the
    import asyncio  # writer for its locks (daemon_alive, faces_lock) never does

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Durable:
    """Files (open descriptors or paths) and folders that must be on disk before going on."""

    files: tuple[int | Path, ...] = ()
    folders: tuple[Path, ...] = ()
    dev: int | None = None  # the file system all of them are on, when the writer knows it


Steps = Generator[Durable, None, T]


def fsync_path(path: Path, flags: int = 0) -> None:
    """fsync a file or folder by its path (``flags`` added to O_RDONLY)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_point(point: Durable) -> None:
    """Make one point durable with fsync, file by file and folder by folder."""
    for f in point.files:
        if isinstance(f, int):
            os.fsync(f)
        else:
            fsync_path(f, os.O_NOFOLLOW)
    for d in point.folders:
        fsync_path(d, os.O_DIRECTORY)


def run_now(steps: Steps[T]) -> T:
    """Drive ``steps`` on this thread, making each point durable as it comes (fsync)."""
    try:
        point = next(steps)
        while True:
            fsync_point(point)
            point = steps.send(None)
    except StopIteration as stop:
        return cast(T, stop.value)


# --------------------------------------------------------------------------- syncfs


@functools.cache
def _syncfs_fn() -> Callable[[int], int] | None:
    """libc's syncfs, loaded on first use: ctypes costs a command ~5 ms, and one that only
    reads (``status``: is the daemon alive?) never syncs. None: not Linux."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):  # not Linux: every point is fsynced
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast(Callable[[int], int], fn)


def has_syncfs() -> bool:
    """True where a file system can be synced whole (Linux): a burst's rounds are."""
    return _syncfs_fn() is not None


def syncfs(fd: int) -> None:
    """Write back and commit everything dirty on the file system ``fd`` is on (Linux)."""
    import ctypes

    fn = _syncfs_fn()
    assert fn is not None
    if fn(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


def _syncfs_points(points: list[Durable]) -> None:
    """One syncfs per file system that the points touch. A point that names its file system
    (``dev``) is not stat'ed item by item: in a burst that spares a few system calls per
    write, each of which hands the interpreter's lock back and forth with the event loop."""
    done: set[int] = set()
    for point in points:
        items = (*point.files, *point.folders)
        if point.dev is not None:
            if point.dev not in done and items:
                _syncfs_item(items[0])
                done.add(point.dev)
            continue
        for item in items:
            dev = os.fstat(item).st_dev if isinstance(item, int) else os.stat(
                item, follow_symlinks=False
            ).st_dev  # fmt: skip
            if dev not in done:
                _syncfs_item(item)
                done.add(dev)


def _syncfs_item(item: int | Path) -> None:
    if isinstance(item, int):
        syncfs(item)
        return
    fd = os.open(item, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the committer


@dataclass
class _Job:
    steps: Steps[Any]
    future: asyncio.Future[Any]
    point: Durable | None = None
    result: Any = None
    error: BaseException | None = None
    done: bool = False

    def advance(self, error: BaseException | None) -> None:
        """Run the steps to their next point (or their end), throwing ``error`` in first."""
        try:
            self.point = self.steps.throw(error) if error is not None else self.steps.send(None)
        except StopIteration as stop:
            self.point, self.result, self.done = None, stop.value, True
        except Exception as exc:  # the write failed: its awaiting turn gets the error
            self.point, self.error, self.done = None, exc, True


@dataclass
class GroupCommitter:
    """Drives the steps of every conversation's durable writes on a few threads, in batches:
    a thread that comes free takes everything queued as its batch (one write at a time when
    idle, many in a burst). Two threads, so that one conversation's commit never waits behind
    another's (the next turn's first write is on its request's critical path while the last
    turn's commit is still being made durable). :meth:`close` ends the threads."""

    threads: int = 2
    group_min: int = 2  # points made durable together by one syncfs from this many on
    batches: int = 0  # counters, for the benchmarks and tests
    grouped: int = 0  # rounds of points made durable by syncfs
    _jobs: list[_Job] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _workers: list[threading.Thread] = field(default_factory=list)
    _idle: int = 0
    _closed: bool = False

    async def run(self, steps: Steps[T]) -> T:
        """Drive ``steps`` to their end on a committer thread. It always runs to its end
        before anything else touches the conversation's files: a cancel waits for it."""
        import asyncio

        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            self._jobs.append(_Job(steps, future))
            if not self._idle and len(self._workers) < self.threads:
                worker = threading.Thread(target=self._main, name="group-commit", daemon=True)
                self._workers.append(worker)
                worker.start()
            self._cv.notify()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait([future])
            raise

    def withdraw(self, steps: Steps[Any]) -> bool:
        """Take back a write that no thread has begun: its steps never run, and the awaiting
        :meth:`run` returns None. False when a thread has taken it already (or it was never
        queued): it then runs to its end as usual. Called on the loop that queued it."""
        with self._cv:
            at = next((i for i, j in enumerate(self._jobs) if j.steps is steps), None)
            if at is None:
                return False
            job = self._jobs.pop(at)
        steps.close()
        if not job.future.done():
            job.future.set_result(None)
        return True

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            workers, self._workers = self._workers, []
        for worker in workers:
            if worker is not threading.current_thread():
                worker.join(timeout=60)

    def _main(self) -> None:
        while True:
            with self._cv:
                self._idle += 1
                while not self._jobs and not self._closed:
                    self._cv.wait()
                self._idle -= 1
                if COMMIT_LAG:  # tests only: a committer busy with a burst
                    end = time.monotonic() + COMMIT_LAG
                    while (left := end - time.monotonic()) > 0 and not self._closed:
                        self._cv.wait(left)
                batch, self._jobs = self._jobs, []
                if not batch:  # closed (or, with the lag, every job withdrawn meanwhile)
                    if self._closed:
                        return
                    continue
            self._run_batch(batch)
            loops: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
            for job in batch:
                loops.setdefault(job.future.get_loop(), []).append(job)
            for loop, jobs in loops.items():  # one wake-up of each loop per batch
                with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                    loop.call_soon_threadsafe(_resolve, jobs)

    def _run_batch(self, batch: list[_Job]) -> None:
        self.batches += 1
        for job in batch:
            job.advance(None)
        while True:
            waiting = [job for job in batch if not job.done]
            if not waiting:
                return
            points = [job.point for job in waiting if job.point is not None]
            if len(waiting) >= self.group_min and has_syncfs():
                self.grouped += 1
                try:
                    _syncfs_points(points)
                except OSError as exc:  # nothing in the round is known to be durable
                    for job in waiting:
                        job.advance(exc)
                    continue
                for job in waiting:
                    job.advance(None)
                continue
            for job in waiting:
                error: OSError | None = None
                try:
                    fsync_point(job.point or Durable())
                except OSError as exc:
                    error = exc
                job.advance(error)


def _resolve(batch: list[_Job]) -> None:
    for job in batch:
        if job.future.done():
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)
