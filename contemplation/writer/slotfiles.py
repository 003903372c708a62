"""Slot files removed from llama-server's ``--slot-save-path`` (a folder outside the home,
named by the provider's ``slot_save_path``), for conversations that are gone.

Only names the daemon made are removed (``contemplation-kv-<24 hex>.bin``: no separator, no
dot-name, so no name leads out of the folder), each looked up relative to the folder opened
once without following a link, and only a regular file (a link of that name, or a folder,
is left as it is). The daemon removes them when it sees a conversation gone, or reads the
map and finds one gone; a command that makes them go while no daemon runs, itself
(:func:`drop_gone`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from contemplation.writer import kvmap

NAME = kvmap.NAME  # the map's names, none other


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


def drop_gone(home: Path, folders: Mapping[str, Path]) -> dict[str, list[str]]:
    """The files the home's durable map (:mod:`.kvmap`) gives conversations gone from
    ``active/`` (archived, pruned, deleted), removed from each provider's folder
    (``folders``: provider → the server's folder, absolute) by :func:`drop_slot_files`.
    Returns, per provider, the names removed (none: left out). The map is not written: the
    daemon frees those names when it next reads it, and a file already removed is passed
    over. For a command that made conversations go while no daemon runs (a running daemon
    removes them itself when it sees them gone, and owns the map)."""
    out: dict[str, list[str]] = {}
    for provider, folder in folders.items():
        gone = kvmap.load(home, provider).gone
        if gone and (removed := drop_slot_files(folder, gone)):
            out[provider] = removed
    return out
