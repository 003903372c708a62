"""Slot files removed from llama-server's ``--slot-save-path`` (a folder outside the home,
named by the provider's ``slot_save_path``), for conversations that are gone.

Only names the daemon made are removed (``contemplation-kv-<24 hex>.bin``: no separator, no
dot-name, so no name leads out of the folder), each looked up relative to the folder opened
once without following a link, and only a regular file (a link of that name, or a folder,
is left as it is).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

NAME = re.compile(r"contemplation-kv-[0-9a-f]{24}\.bin")  # kvmap's names, none other


def drop_slot_files(folder: Path, names: Iterable[str]) -> list[str]:
    """Remove the files ``names`` from ``folder`` (absolute); returns those removed. A
    folder that is not there or not a folder (or a link to one) removes nothing."""
    if not folder.is_absolute():
        return []
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    removed: list[str] = []
    try:
        for name in names:
            if not NAME.fullmatch(name):
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
            except FileNotFoundError:
                continue
    finally:
        os.close(dfd)
    return removed
