"""Entry points read once per process: what each plugin registers, and what failed.

Every registry (NEED tools, backends, context kinds) loads its group through :func:`load`:
an entry point names one kind, several, or a callable that returns one or several; a plugin
that fails to import, returns something else or raises costs one log line and a ``failed``
row (shown by ``plugins`` and ``doctor``), never the process. Reading the entry points costs
about 25 ms, so a registry reads them only when it is asked for something it does not hold
already.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

import structlog

log = structlog.get_logger("contemplation.plugins")

K = TypeVar("K")
Failure = tuple[str, str]  # (entry point and distribution, why it was not loaded)
BUILT_IN = "built in"
IN_PROCESS = "in process"  # put in place by tests and benchmarks (Registry.replace)


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


class Registry(Generic[N]):
    """The kinds of one sort by name: the built-ins (``builtins`` registers them) then the
    plugins of entry point ``group``, both through :meth:`register`, each read on first use
    (a name a built-in has never reads the entry points). ``adopt`` checks or adapts a kind
    before it is kept (given its origin)."""

    def __init__(
        self,
        group: str,
        kind: type[N],
        builtins: Callable[[], None],
        adopt: Callable[[N, str], N] = lambda k, origin: k,
    ) -> None:
        self.group, self.kind = group, kind
        self._builtins, self._adopt = builtins, adopt
        self._kinds: dict[str, N] = {}
        self._origins: dict[str, str] = {}  # kind name -> the distribution that registered it
        self._failed: list[Failure] = []
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

    def _read_builtins(self) -> None:
        if "builtins" not in self._read:
            self._read.add("builtins")
            self._builtins()

    def _read_plugins(self) -> None:
        if "plugins" not in self._read:
            self._read.add("plugins")
            self._failed.extend(load(self.group, self.kind, self.register))


def load(group: str, kind: type[K], register: Callable[[K, str], None]) -> list[Failure]:
    """Register every kind the entry points of ``group`` give (``register(kind, dist)``)."""
    from importlib.metadata import entry_points

    failed: list[Failure] = []
    for ep in entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        try:
            found = ep.load()
            if callable(found) and not isinstance(found, kind):
                found = found()
            for one in [found] if isinstance(found, kind) else _each(found, kind):
                register(one, dist)
        except Exception as exc:  # a plugin's bug must not stop the daemon
            where = f"{ep.name} ({dist})"
            failed.append((where, f"{type(exc).__name__}: {exc}"))
            log.warning("plugin_failed", plugin=where, group=group, error=str(exc))
    return failed


def _each(found: object, kind: type[K]) -> list[K]:
    name = kind.__name__
    if not isinstance(found, Iterable):
        raise TypeError(f"gave {type(found).__name__}, not a {name} or several")
    out = list(found)
    for one in out:
        if not isinstance(one, kind):
            raise TypeError(f"gave {type(one).__name__} among its kinds, not a {name}")
    return out
