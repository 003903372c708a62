"""What the index says of one conversation: the summary row every face shows, made from the
folder's JSON and what the log itself says (:class:`Facts`). Pure but for the folder's times
and sizes (:func:`disk_use`, and the folder's own time for a conversation with nothing said)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contemplation.store.layout import Conv, topic_of_id


@dataclass(frozen=True, slots=True)
class Facts:
    """What the log itself says of a conversation (kept in the row, so that a change of state
    alone does not read the log again)."""

    blocks: int = 0
    agent_msgs: int = 0  # the agent's blocks (messages and answers to needs)
    model_turns: int = 0  # the model's blocks
    log_ts: float = 0.0  # the last dated header (local time), 0: none
    bytes: int = 0  # every segment of the log


def disk_use(path: str, depth: int = 3) -> int:
    """Bytes of the regular files in a folder and its folders (``depth`` levels; links are
    not followed)."""
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                    elif depth > 1 and e.is_dir(follow_symlinks=False):
                        total += disk_use(e.path, depth - 1)
                except OSError:
                    continue
    except OSError:
        return total
    return total


def header_ts(text: str) -> float:
    """A header's time as epoch seconds (0: none or not a time)."""
    if text:
        with contextlib.suppress(ValueError, OverflowError):
            return datetime.strptime(text, _time_format()).timestamp()
    return 0.0


def _iso_ts(text: str) -> float:
    with contextlib.suppress(ValueError, OverflowError):
        return datetime.fromisoformat(text).timestamp()
    return 0.0


def as_int(value: Any) -> int:
    """A JSON value that should be a count, as one (anything else: 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def clock(ts: float) -> str:
    return time.strftime(_time_format(), time.localtime(ts)) if ts else ""


def _time_format() -> str:
    """The log's header time (its module loads the models: imported when a row is made)."""
    from contemplation.protocol.logformat import TIME_FORMAT

    return TIME_FORMAT


def summary_row(  # noqa: PLR0917 - the parts of one row
    conv: Conv,
    archived: bool,
    meta: dict[str, Any],
    state: dict[str, Any],
    facts: Facts,
    problem: str = "",
) -> dict[str, Any]:
    """The one summary every face shows (``list``, ``status``, MCP, the dashboard). Turns,
    messages and activity come from the log's own blocks where state has nothing better, so a
    folder made by hand, restored from a backup or imported shows when it was really used:
    activity is the log's last dated header (or the turn on the backend now; with nothing said
    yet, the folder's own time). ``problem``: what is wrong with the folder's files (status
    "unreadable", and the row says it)."""
    status = "unreadable" if problem else _str(state.get("status"), "pending")
    since = state.get("generating_since")
    last = facts.log_ts
    if status == "generating" and isinstance(since, int | float):
        last = max(last, float(since))
    if not last:  # nothing said yet: the folder's own time (to the nanosecond), else created
        with contextlib.suppress(OSError):
            last = os.stat(conv.dir).st_mtime
    if not last:
        last = _iso_ts(_str(meta.get("created")))
    error = state.get("last_error")
    pending = state.get("pending_needs")
    return {
        "id": conv.id,
        "topic": _str(meta.get("topic")) or topic_of_id(conv.id),
        "status": status,
        "completed": archived,
        "model": _str(meta.get("model")),
        "backend": _str(meta.get("backend")),
        "template": _str(meta.get("template")),
        "created": _str(meta.get("created")),
        "last_activity": clock(last),
        "last_activity_ts": last,
        "turns": max(as_int(state.get("turns")), facts.model_turns),
        "messages": max(as_int(state.get("messages_processed")), facts.agent_msgs),
        "blocks": facts.blocks,
        "bytes": facts.bytes,
        "pending_needs": [str(n) for n in pending] if isinstance(pending, list) else [],
        "last_error": error if isinstance(error, dict) else None,
        "retry_count": as_int(state.get("retry_count")),
        "generating_since": float(since)
        if status == "generating" and isinstance(since, int | float)
        else None,
        "forked_from": forked_from(meta),
        "problem": problem,
    } | ({"panel": seats} if (seats := panel_seats(meta)) else {})


def panel_seats(meta: dict[str, Any]) -> list[dict[str, str]]:
    """metadata.json's panel (its seats, the synthesizing one last: label, model, backend);
    empty without one. A panel's top-level ``model`` is its first seat's, not what answers."""
    raw = meta.get("panel")
    if not isinstance(raw, list) or not raw:
        return []
    synth = meta.get("synthesize")
    out = []
    for s in [*raw, *([synth] if isinstance(synth, dict) else [])]:
        if isinstance(s, dict) and isinstance(s.get("label"), str):
            out.append(
                {
                    "label": s["label"],
                    "model": _str(s.get("model")),
                    "backend": _str(s.get("backend")),
                }
            )
    return out


def forked_from(meta: dict[str, Any]) -> dict[str, Any] | None:
    """metadata.json's ``forked_from`` ({id, block}: see :mod:`contemplation.faces.fork`), or
    None."""
    raw = meta.get("forked_from")
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        return None
    block = raw.get("block")
    return {"id": raw["id"], "block": block if isinstance(block, int) else 0}
