"""Owner only: every folder under the home is 0700 and every file 0600, whatever umask the
process was started with (a secret an approved lookup read lands in ``messages.log``; that
log must be no more readable than the secret was).

Two layers, so neither is the only guard:

* every command sets the umask to 077 first (:func:`private_umask`, from the CLI's group:
  ``run``, ``mcp`` and the dashboard the daemon serves are commands too), so what a library
  makes for us is private as well (SQLite's ``-wal`` and ``-shm``, a copied file);
* the writer creates each file with :data:`FILE_MODE` and each folder with :data:`DIR_MODE`,
  so code that uses the package as a library, under any umask, makes private files too.

A home an older version made open (0755) is closed at the daemon's start (:func:`close`):
a home folder the others cannot enter keeps everything below it from them, whatever the
modes of the files inside, so the files are not walked and changed one by one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
UMASK = 0o077
OTHERS = 0o077  # the group's and everyone else's bits


def private_umask() -> None:
    """What this process creates from now on is the owner's alone."""
    os.umask(UMASK)


def open_mode(path: Path) -> int | None:
    """``path``'s permission bits when the group or others have any of them; None when they
    have none or there is no such file."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    return mode if mode & OTHERS else None


def close(folder: Path) -> int | None:
    """Make ``folder`` the owner's alone (0700); returns the mode it had when the others had
    any access to it (None: it was private, or is not there)."""
    was = open_mode(folder)
    if was is not None:
        os.chmod(folder, DIR_MODE)
    return was
