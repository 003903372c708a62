"""What a plugin's code raises is that plugin's failure, never the daemon's: the one test.

A plugin may raise anything, :class:`BaseException` included: ``KeyboardInterrupt``,
``SystemExit`` (``sys.exit()``), ``asyncio.CancelledError``, a bare ``BaseException``. Each
guard around plugin code (a backend's calls, a NEED tool's, a context kind's, a panel's, an
import) catches every one of them and makes it that plugin's failure, with one exception: a
``CancelledError`` that is the daemon cancelling its own task (an agent's cancel, a stop, a
timeout) must go on, or the cancel would be lost. Told apart by the task: a cancel *request*
(``Task.cancel``) counts in ``Task.cancelling()``; a ``CancelledError`` that plugin code
raises on its own does not. A real Ctrl-C never arrives as a ``KeyboardInterrupt`` in the
daemon (it handles SIGINT and SIGTERM itself), so one there is the plugin's.

What no guard in the process can contain (a call that blocks the event loop, ``os._exit``
while serving, a crash of the interpreter) is said in docs/guides/plugins.md, with how the daemon
notices it; :mod:`contemplation.base.ending` makes such an ``os._exit`` a failure's exit
code, and bounds the exit that a plugin's threads would hold.
"""

from __future__ import annotations

import asyncio


def ours(exc: BaseException) -> bool:
    """``exc`` is the running task being cancelled by its owner: let it go on."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop: plain code, the exception is the plugin's
        return False
    return task is not None and task.cancelling() > 0


def described(exc: BaseException) -> str:
    """``Type: message`` (the type alone when there is no message)."""
    said = str(exc)
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
