"""How the process ends: within a bound whatever a plugin's threads do, and never with a
success code when a plugin's ``os._exit`` ended it.

Python's exit joins every thread that is not a daemon thread (and every thread pool's
workers) before the process ends: one that a plugin started and that never ends kept the
daemon alive after SIGTERM until a SIGKILL, and ``plugins``, ``doctor`` or ``new`` after
their work was done. So once the work is over (:func:`arm`: the CLI's entry point when its
command returns or exits, the daemon as soon as its clean stop is done) a watch thread gives
the exit :data:`EXIT_BOUND` seconds; a process still alive then writes one log line naming
each thread still running and the plugin it came from (``exit_held``) and ends with
``os._exit`` and the code it was going to exit with. Only in the program itself
(:func:`enable`, from the entry point): a test that runs a command in its own process is
never ended by it.

``os._exit`` called by a plugin while the daemon serves (:func:`exits_are_failures`) ends
the process with :data:`~contemplation.base.exits.EXIT_PLUGIN` instead of the code it asked
for (``os._exit(0)`` read as a clean stop, which systemd's ``Restart=on-failure`` and
launchd's ``KeepAlive`` leave stopped), after one line naming the plugin and the code
(``plugin_exited``). While a plugin is loaded, :func:`~contemplation.base.plugins.
exit_refused` makes it an exception instead (it wraps whatever ``os._exit`` is then).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

from contemplation.base.exits import EXIT_PLUGIN

# light on purpose (the CLI's entry point imports it): the log and the plugins' table are
# imported when they are needed, at an exit that is held or a plugin's os._exit

EXIT_BOUND = 2.0  # seconds the exit may take once the work is done
_real_exit = os._exit  # the process's own: what the watch and the wrapper end it with
_armed: dict[str, object] = {}  # "enabled": True; "code": the exit code; "watch": its thread
_lock = threading.Lock()


def enable() -> None:
    """This process is the program (the CLI's entry point): :func:`arm` may end it."""
    _armed["enabled"] = True


def arm(code: int, bound: float = EXIT_BOUND) -> None:
    """The work is done and the process exits with ``code``: if it is still alive ``bound``
    seconds from now, name what holds it and end it with ``code``. A second call only
    changes the code. Does nothing unless :func:`enable` was called."""
    with _lock:
        if not _armed.get("enabled"):
            return
        _armed["code"] = code
        if "watch" in _armed:
            return
        watch = threading.Thread(target=_watch, args=(bound,), name="exit-watch", daemon=True)
        _armed["watch"] = watch
    watch.start()


def _watch(bound: float) -> None:
    deadline = time.monotonic() + bound
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)
    code = _armed.get("code")
    code = code if isinstance(code, int) else 1
    with contextlib.suppress(BaseException):  # whatever the log does, the process ends
        held = [f"{t.name} ({origin(t)})" for t in lingering()]
        _log().warning("exit_held", threads=held, waited_s=bound, code=code)
    flush()
    _real_exit(code)


def lingering() -> list[threading.Thread]:
    """The threads still running that the exit would wait for (not the main one, not the
    daemon threads)."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def origin(thread: threading.Thread) -> str:
    """Where ``thread`` came from: ``plugin NAME (DIST)`` when its code is a plugin's (its
    target's module, its class's, or a module its stack is in), else ``module M``."""
    modules: list[str] = []
    target = getattr(thread, "_target", None)
    if target is not None:
        modules.append(getattr(target, "__module__", None) or "")
    if type(thread).run is not threading.Thread.run:
        modules.append(type(thread).__module__)
    frame = sys._current_frames().get(thread.ident or -1)
    modules.extend(_stack(frame))
    plugin, name = _whose(modules)
    return f"plugin {name}" if plugin else f"module {name}"


def _stack(frame: FrameType | None) -> list[str]:
    """The modules of ``frame`` and its callers, innermost first."""
    found: list[str] = []
    while frame is not None and len(found) < 64:
        found.append(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back
    return found


def _ours(module: str) -> bool:
    top = module.partition(".")[0]
    return top in {"contemplation", "threading", "concurrent", "asyncio"} or top in (
        sys.stdlib_module_names
    )


def _log() -> Any:
    """The process's log; a plain line on stderr when the command set none up (structlog's
    default is stdout, which is the command's output, and no command prints log records)."""
    import structlog

    from contemplation.base.logs import human

    if structlog.is_configured():
        return structlog.get_logger("contemplation.exit")
    return structlog.wrap_logger(structlog.PrintLogger(sys.stderr), processors=[human])


def flush() -> None:
    """What the process wrote is out before ``os._exit`` (which flushes nothing)."""
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()


@contextlib.contextmanager
def exits_are_failures() -> Iterator[None]:
    """While the daemon serves, ``os._exit`` by anyone else (a plugin's stream, tool or
    thread) logs ``plugin_exited`` (the code asked for, the plugin) and ends the process with
    :data:`EXIT_PLUGIN`; a forked child's exits as it asked."""
    pid = os.getpid()
    before = os._exit

    def failure(status: int) -> NoReturn:
        if os.getpid() != pid:
            before(status)
        with contextlib.suppress(BaseException):
            caller = _caller(sys._getframe(1))
            _log().error(
                "plugin_exited", asked=status, plugin=caller, code=EXIT_PLUGIN,
                why="os._exit while the daemon served: ended as a failure, to be restarted",
            )  # fmt: skip
        flush()
        _real_exit(EXIT_PLUGIN)

    os._exit = failure
    try:
        yield
    finally:
        if os._exit is failure:
            os._exit = before


def _caller(frame: FrameType | None) -> str:
    """The plugin whose code is on the stack from ``frame`` out (``NAME (DIST)``), else the
    innermost module that is not ours nor the standard library's."""
    return _whose(_stack(frame))[1]


def _whose(modules: list[str]) -> tuple[bool, str]:
    """(True, ``NAME (DIST)``) for the first of ``modules`` a plugin owns; else (False, the
    first that is not ours nor the standard library's, or the first, or ``?``)."""
    from contemplation.base import plugins

    for module in modules:
        owner = plugins.owner(module)
        if owner is not None:
            return True, owner
    named = next((m for m in modules if m and not _ours(m)), modules[0] if modules else "")
    return False, named or "?"
