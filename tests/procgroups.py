"""Every server a test starts runs in a process group of its own and is stopped however pytest
ends: a failure (the fixture's finalizer), Ctrl-C, SIGTERM (made a KeyboardInterrupt, so that
the finalizers run and pytest prints its summary) and any exit (an atexit SIGKILL to the group
of each process still running). A second SIGTERM stops them all at once and exits 143.

Use :func:`popen` for a process that must not outlive the run, :func:`kill` to stop one and
every process it started."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
from types import FrameType
from typing import Any

_running: list[subprocess.Popen[Any]] = []
_terminating = False


def popen(args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` in a new session (its own process group: a Ctrl-C at the terminal
    reaches pytest alone, and :func:`kill` reaches the process's own children), registered to
    be killed at exit if it is still running."""
    proc: subprocess.Popen[Any] = subprocess.Popen(args, start_new_session=True, **kwargs)
    track(proc)
    return proc


def track(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc``'s group at exit if it still runs (it must lead a group of its own)."""
    _running[:] = [p for p in _running if p.poll() is None]  # only the live ones: bounded
    _running.append(proc)


def kill(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """SIGKILL to ``proc``'s process group if ``proc`` still runs, then reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


def kill_all() -> None:
    """Every registered process still running, and its group (their own stop had its chance)."""
    for proc in list(_running):
        kill(proc, timeout=5)
    _running.clear()


atexit.register(kill_all)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _terminating  # noqa: PLW0603 - one SIGTERM per process is the point
    if _terminating:  # the first one's clean stop is taking too long
        kill_all()
        os._exit(128 + signum)
    _terminating = True
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


def stop_on_sigterm() -> None:
    """SIGTERM ends pytest as Ctrl-C does. Again after a test that ran the daemon in-process:
    asyncio's ``remove_signal_handler`` leaves SIGTERM at its default, an exit without
    finalizers."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
