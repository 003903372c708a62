"""Seeding a new home's ``templates/`` with the templates that ship with the package.

Each template is built under a dot-name in ``templates/`` (never listed: not a template name)
from atomically written files, then renamed into place; a template folder that exists is
never touched, so a person's own template always wins.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from contemplation.base.privacy import DIR_MODE
from contemplation.store.layout import Home, valid_id
from contemplation.store.templates import shipped_templates
from contemplation.writer.files import atomic_write_bytes, fsync_dir

MAX_TEMPLATE_FILE_BYTES = 1024 * 1024


def seed_templates(home: Home, *, durable: bool = True) -> list[str]:
    """Copy each shipped template the home does not have; returns the names copied."""
    home.templates.mkdir(DIR_MODE, parents=True, exist_ok=True)
    seeded: list[str] = []
    for src in sorted(shipped_templates().iterdir()):
        if not valid_id(src.name) or not (src / "template.toml").is_file():
            continue
        target = home.templates / src.name
        if target.exists() or target.is_symlink():
            continue
        if _place(src, home, durable=durable):
            seeded.append(src.name)
    if seeded and durable:
        fsync_dir(home.templates)
    return seeded


def _place(src: Path, home: Home, *, durable: bool) -> bool:
    """Build one template under a dot-name and rename it in; False if one appeared first."""
    name = src.name
    staging = home.templates / f".seed-{name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        staging.mkdir(DIR_MODE)
        with os.scandir(src) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    with open(entry.path, "rb") as f:
                        data = f.read(MAX_TEMPLATE_FILE_BYTES)
                    atomic_write_bytes(staging / entry.name, data, durable=durable)
        os.rename(staging, home.templates / name)
    except OSError:  # someone made it meanwhile (not empty), or the disk is full
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        return False
    return True
