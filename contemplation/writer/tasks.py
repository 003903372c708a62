"""MCP task records (the tasks extension, :mod:`contemplation.faces.mcp.tasks`): one small JSON
file per task in the conversation's ``tasks/`` folder, named by the task's secret part.

A record is written atomically and durably (temp file, fsync, rename, fsync of the folder;
the folder itself is made durable the first time), so once :func:`write_task` returns a
``tasks/get`` from any MCP server process on the same home finds it, across crashes. It moves
with the conversation (archive, reopen) and goes when the conversation is pruned.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from contemplation.store.layout import Conv
from contemplation.writer.files import atomic_write_json, fsync_dir

TASKS_DIR = "tasks"


def task_path(conv: Conv, secret: str) -> Path:
    return conv.dir / TASKS_DIR / f"{secret}.json"


def write_task(conv: Conv, secret: str, record: dict[str, Any], *, durable: bool = True) -> None:
    """Create or replace the record of task ``secret`` in ``conv``."""
    folder = conv.dir / TASKS_DIR
    if not folder.is_dir():
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        if durable:
            fsync_dir(conv.dir)
    atomic_write_json(task_path(conv, secret), record, durable=durable)


def read_task(conv: Conv, secret: str) -> dict[str, Any] | None:
    """The record, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads(task_path(conv, secret).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
