"""Entry points read once per process: what each plugin registers, and what failed.

Every registry (NEED tools, backends, context kinds) loads its group through :func:`load`:
an entry point names one kind, several, or a callable that returns one or several; a plugin
that fails to import, returns something else or raises (``BaseException`` included:
``sys.exit``, ``KeyboardInterrupt``; and ``os._exit``, which raises :class:`Exited` instead
while plugin code is loaded) costs one log line and a ``failed`` row (shown by ``plugins`` and
``doctor``), never the process. One that takes longer than :data:`SLOW_IMPORT` to load is
named too (the daemon's start waits for it). What cannot be caught in the process (a crash
of the interpreter, a signal, an import that never ends) is found by loading each plugin in
a child process first (:mod:`contemplation.faces.cli.probe`), which :func:`refuse` then keeps
out. Reading the entry points costs about 25 ms, so a registry reads them only when it is
asked for something it does not hold already.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, NoReturn, Protocol, TypeVar

import structlog

from contemplation.base.contained import described

log = structlog.get_logger("contemplation.plugins")

K = TypeVar("K")
Failure = tuple[str, str]  # (entry point and distribution, why it was not loaded)
Slow = tuple[str, float]  # (entry point and distribution, seconds its loading took)
BUILT_IN = "built in"
IN_PROCESS = "in process"  # put in place by tests and benchmarks (Registry.replace)
SLOW_IMPORT = 1.0  # seconds: a plugin that takes longer to load is named

# (group, entry point, distribution) -> why it is not loaded: a child process found that
# loading it ends its process (see refuse)
_refused: dict[tuple[str, str, str], str] = {}
# the top-level module of each entry point loaded -> "entry point (distribution)"; and each
# distribution of one: whose code a thread or a call is (see owner)
_modules: dict[str, str] = {}
_dists: set[str] = set()


class Exited(BaseException):
    """``os._exit`` called by plugin code while it was loaded: raised in its place."""

    def __init__(self, code: int) -> None:
        super().__init__(f"called os._exit({code}) while it was loaded")


def refuse(group: str, name: str, dist: str, why: str) -> None:
    """Keep the entry point ``name`` of ``dist`` in ``group`` out of this process (a failed
    row saying ``why``): loading it in a child process ended that process."""
    _refused[(group, name, dist)] = why


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


class Registry(Generic[N]):
    """The kinds of one sort by name: the built-ins (those ``builtins`` returns) then the
    plugins of entry point ``group``, both through :meth:`register`, each read on first use
    (a name a built-in has never reads the entry points). ``adopt`` checks or adapts a kind
    before it is kept (given its origin)."""

    def __init__(
        self,
        group: str,
        kind: type[N],
        builtins: Callable[[], Iterable[N]],
        adopt: Callable[[N, str], N] = lambda k, origin: k,
        *,
        former: tuple[str, ...] = (),
    ) -> None:
        self.group, self.kind = group, kind
        self.former = former  # groups of an earlier name, still read (deprecated)
        self._builtins, self._adopt = builtins, adopt
        self._kinds: dict[str, N] = {}
        self._origins: dict[str, str] = {}  # kind name -> the distribution that registered it
        self._failed: list[Failure] = []
        self._slow: list[Slow] = []
        self._read: set[str] = set()  # "builtins", "plugins": what has been read

    def register(self, kind: N, origin: str = BUILT_IN) -> None:
        """Add a kind (a second one of the same name is refused: names are what the
        configuration and the models say)."""
        if not isinstance(kind, self.kind):
            raise TypeError(f"not a {self.kind.__name__}: {kind!r}")
        if kind.name in self._kinds:
            raise ValueError(f"a {self.kind.__name__} named {kind.name!r} is registered already")
        self._kinds[kind.name] = self._adopt(kind, origin)
        self._origins[kind.name] = origin

    def replace(self, kind: N) -> None:
        """Put ``kind`` in place of any of its name (tests, and in-process fakes)."""
        self._read_builtins()
        self._kinds.pop(kind.name, None)
        self.register(kind, IN_PROCESS)

    def forget(self, name: str) -> None:
        """Take the kind ``name`` out (tests: what they put in place)."""
        self._kinds.pop(name, None)
        self._origins.pop(name, None)

    def get(self, name: str) -> N | None:
        """The kind ``name``: the built-ins first, the entry points only when none has it."""
        self._read_builtins()
        if name not in self._kinds:
            self._read_plugins()
        return self._kinds.get(name)

    def kinds(self) -> dict[str, N]:
        """Every kind by name, in the order they were registered."""
        self._read_builtins()
        self._read_plugins()
        return dict(self._kinds)

    def origins(self) -> dict[str, str]:
        """Which distribution registered each kind (``built in`` for the package's own)."""
        self.kinds()
        return dict(self._origins)

    def failures(self) -> list[Failure]:
        """The plugins that could not be loaded: (entry point and distribution, why)."""
        self.kinds()
        return list(self._failed)

    def slow(self) -> list[Slow]:
        """The plugins that took longer than :data:`SLOW_IMPORT` to load: (which, seconds)."""
        self.kinds()
        return list(self._slow)

    def _read_builtins(self) -> None:
        if "builtins" not in self._read:
            self._read.add("builtins")
            for kind in self._builtins():  # registered here, in the order given
                self.register(kind)

    def _read_plugins(self) -> None:
        if "plugins" not in self._read:
            self._read.add("plugins")
            for group in (self.group, *self.former):
                failed, slow = load(group, self.kind, self.register)
                self._failed.extend(failed)
                self._slow.extend(slow)


def load(
    group: str, kind: type[K], register: Callable[[K, str], None]
) -> tuple[list[Failure], list[Slow]]:
    """Register every kind the entry points of ``group`` give (``register(kind, dist)``).
    Returns the plugins that failed, and those that were slow to load."""
    from importlib.metadata import entry_points

    failed: list[Failure] = []
    slow: list[Slow] = []
    for ep in entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        where = f"{ep.name} ({dist})"
        refused = _refused.get((group, ep.name, dist))
        if refused is not None:
            failed.append((where, refused))
            continue
        top = ep.module.partition(".")[0]
        if top != "contemplation":  # ours: never a plugin's, whatever names it
            _modules.setdefault(top, where)
            _dists.add(dist)
        started = time.monotonic()
        try:
            with exit_refused():
                found = ep.load()
                if callable(found) and not isinstance(found, kind):
                    found = found()
            took = time.monotonic() - started
            if took > SLOW_IMPORT:
                slow.append((where, took))
                log.warning("plugin_slow", plugin=where, group=group, seconds=round(took, 2))
            for one in [found] if isinstance(found, kind) else _each(found, kind):
                register(one, dist)
        except BaseException as exc:  # a plugin's bug (sys.exit too) must not stop the daemon
            why = str(exc) if isinstance(exc, Exited) else described(exc)
            failed.append((where, why))
            log.warning("plugin_failed", plugin=where, group=group, error=why)
    return failed, slow


def owner(module: str) -> str | None:
    """The plugin whose code ``module`` is: ``entry point (distribution)`` when its top-level
    package is an entry point's loaded in this process, the distribution's name when it is
    another package of such a distribution; None otherwise (ours, or no plugin's)."""
    top = module.partition(".")[0]
    if not top or top == "contemplation":
        return None
    where = _modules.get(top)
    if where is not None or not _dists:
        return where
    from importlib.metadata import packages_distributions

    try:
        found = packages_distributions().get(top, [])
    except Exception:  # a broken distribution's metadata: no name rather than no line
        return None
    return next((d for d in found if d in _dists), None)


@contextlib.contextmanager
def exit_refused() -> Iterator[None]:
    """While plugin code is loaded on this thread, ``os._exit`` raises :class:`Exited` there
    instead of ending the process (another thread's, or a forked child's, still exits)."""
    real = os._exit
    thread, pid = threading.get_ident(), os.getpid()

    def refused(status: int) -> NoReturn:
        if threading.get_ident() == thread and os.getpid() == pid:
            raise Exited(status)
        real(status)

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real


def _each(found: object, kind: type[K]) -> list[K]:
    name = kind.__name__
    if not isinstance(found, Iterable):
        raise TypeError(f"gave {type(found).__name__}, not a {name} or several")
    out = list(found)
    for one in out:
        if not isinstance(one, kind):
            raise TypeError(f"gave {type(one).__name__} among its kinds, not a {name}")
    return out
