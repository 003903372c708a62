"""How this package starts Python processes of its own: they import only the package, its
dependencies and the standard library, never a module lying in a working folder.

``python -m mod`` puts the working folder first on ``sys.path`` and ``python script.py`` the
script's folder, so a ``json.py`` that another user wrote into a shared folder (mode 1777) the
daemon was started from, or a project's ``mcp/`` package where Claude Code starts the MCP
server, would be imported in place of ours. Every child of ours is
therefore started with:

* :data:`SAFE_PATH` (``-P``, Python 3.11+): nothing unsafe is put first on ``sys.path``;
  isolated mode (``-I``) would do that too but also drop the user's site-packages, where a
  ``pip install --user`` puts the package itself;
* ``PYTHONPATH`` kept only for its absolute entries (an empty or relative entry is the
  working folder again), with the folder this package was imported from first, so the child
  imports the same package as its parent;
* a fixed working folder, :data:`CWD` (``/``: nobody else can write there).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

SAFE_PATH = "-P"
CWD = "/"
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding contemplation/


def python(*args: str) -> list[str]:
    """The argv of a child Python of ours: this interpreter, in safe-path mode, then ``args``
    (``"-m", "contemplation.x"``, ...)."""
    return [sys.executable, SAFE_PATH, *args]


def safe_pythonpath(value: str | None) -> str:
    """``PYTHONPATH`` for a child: this package's folder first, then the absolute entries of
    ``value`` (an empty or relative one would name the working folder)."""
    kept = [p for p in (value or "").split(os.pathsep) if p and os.path.isabs(p)]
    return os.pathsep.join(dict.fromkeys([PACKAGE_ROOT, *kept]))


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child Python: ``base`` (this process's by default) with a safe
    ``PYTHONPATH`` and ``PYTHONSAFEPATH`` set, so a Python the child starts in turn is safe
    too."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = safe_pythonpath(env.get("PYTHONPATH"))
    env["PYTHONSAFEPATH"] = "1"
    return env
