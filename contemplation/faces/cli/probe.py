"""Each plugin loaded in a child process of its own, before this process loads it
(``plugins --probe``, ``doctor``).

In the process, a plugin's loading is guarded (:func:`contemplation.base.plugins.load`): what it
raises, ``sys.exit`` and ``os._exit`` included, is a failed row. What no guard can catch (a
crash of the interpreter, a signal, ``exit()`` from C, a load that never ends) would end or
hang the command that asked; a child process shows it instead. An entry point whose child
ended before it said how the load went, or ran past :data:`PROBE_TIMEOUT`, is kept out of
this process (:func:`contemplation.base.plugins.refuse`) with a line naming it; the others are
loaded here as usual, and the child's time to load each is what names a slow one.

The child is ``python -P -m contemplation.faces.cli.probe GROUP NAME DIST``, in ``/`` (see
:mod:`contemplation.base.child`): it loads that one entry point and prints one line,
:data:`SAID` and JSON (``seconds``, ``error``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from contemplation.base import child, plugins
from contemplation.base.contained import described

GROUPS = (
    "contemplation.backends",
    "contemplation.tools",
    "contemplation.context",
    "contemplation.cards",
    "contemplation.panels",  # the cards' former group, still read
)
PROBE_TIMEOUT = 30.0  # seconds one plugin's child may take to load it
PARALLEL = 4  # children at once
SAID = "contemplation-probe: "
API = ("contemplation.plugin",)  # what a plugin is written against: imported first


@dataclass(frozen=True, slots=True)
class Probed:
    """How loading one entry point went in a child process."""

    group: str
    name: str
    dist: str
    seconds: float | None = None  # its load took (None: the child did not say)
    fatal: str = ""  # why the child said nothing: it ended, or ran past the timeout

    @property
    def where(self) -> str:
        return f"{self.name} ({self.dist})"


def probe(timeout: float = PROBE_TIMEOUT) -> list[Probed]:
    """Load every plugin's entry point in a child process of its own (:data:`PARALLEL` at
    once) and keep out of this process each one whose child it ended or hung."""
    from importlib.metadata import entry_points

    named = [
        (group, ep.name, ep.dist.name if ep.dist is not None else "?")
        for group in GROUPS
        for ep in entry_points(group=group)
    ]
    if not named:
        return []
    with ThreadPoolExecutor(min(PARALLEL, len(named))) as pool:
        found = list(pool.map(lambda n: _child(*n, timeout=timeout), named))
    for p in found:
        if p.fatal:
            plugins.refuse(p.group, p.name, p.dist, p.fatal)
    return found


def slow(found: list[Probed]) -> list[plugins.Slow]:
    """The entry points whose child took longer than :data:`~contemplation.base.plugins.
    SLOW_IMPORT` to load them."""
    return [
        (p.where, p.seconds)
        for p in found
        if p.seconds is not None and p.seconds > plugins.SLOW_IMPORT
    ]


def _child(group: str, name: str, dist: str, *, timeout: float) -> Probed:
    argv = child.python("-m", __name__, group, name, dist)
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=child.CWD,
            env=child.environment(),
        )
    except subprocess.TimeoutExpired:  # killed by run
        return Probed(group, name, dist, fatal=f"did not finish loading within {timeout:g} s")
    said = [line for line in done.stdout.splitlines() if line.startswith(SAID)]
    if not said:
        return Probed(group, name, dist, fatal=_ended(done.returncode))
    try:
        seconds = float(json.loads(said[-1][len(SAID) :])["seconds"])
    except (ValueError, KeyError, TypeError):
        return Probed(group, name, dist, fatal=_ended(done.returncode))
    return Probed(group, name, dist, seconds=seconds)


def _ended(code: int) -> str:
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exit status {code}"
    return f"ended its process while it was loaded ({how})"


def _main(group: str, name: str, dist: str) -> None:
    """The child: load one entry point as the parent would (``os._exit`` raises then, see
    :func:`~contemplation.base.plugins.exit_refused`) and say how long it took, and what it
    raised; what ends or hangs the child is what the parent could not have caught."""
    from importlib.metadata import entry_points

    found = [
        ep
        for ep in entry_points(group=group, name=name)
        if (ep.dist.name if ep.dist is not None else "?") == dist
    ]
    _api()
    started = time.monotonic()
    error = ""
    try:
        with plugins.exit_refused():
            loaded = found[0].load()
            if callable(loaded):
                loaded()
    except BaseException as exc:  # said in the parent's own load, as a failed row
        error = described(exc)
    took = time.monotonic() - started
    print(SAID + json.dumps({"seconds": took, "error": error}), flush=True)
    os._exit(0)  # said: a thread the plugin started must not keep the child waiting


def _api() -> None:
    """What a process has imported before it loads its plugins (the registries, the kinds'
    contracts, the built-in kinds): the time to load a plugin is then its own."""
    import importlib

    from contemplation import backends

    for module in (*API, *(f"contemplation.backends.{kind}" for kind in backends.BUILT_IN)):
        importlib.import_module(module)


if __name__ == "__main__":
    _main(*sys.argv[1:4])
