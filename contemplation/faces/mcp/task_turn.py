"""Which part of a conversation's log is one task's: each task is its own question.

A task's message is the agent's own block (a message, or its own answer to a need) after the
task's ``since`` whose text is the one the tool sent (its sha256 and length are kept in the
task's record; the block may begin with more, as an answer's ``RESPONSE TO NEED`` lines).
Several tasks sent on one conversation at once (Claude Code calls tools in parallel) share a
``since``: the daemon takes their messages one at a time in arrival order, so the n-th task
with the same text (by inbox name, then creation) owns the n-th such block from its
``since`` on (tasks whose message was found before that ``since`` are not counted).
The task's turn runs from its message to the agent's next own block (exclusive): the reply
and what its needs led to (the rules' answers, the replies after them), never a later
message's reply. A task with no message (``conversation_approve``) starts at its ``since``.

Once found, the message's cursor (``at``) and the end (``end``) are kept in the record, so
a later look is cheap and stable (cursors count across rotated segments). No SDK here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from contemplation.store.cursors import blocks_since, own
from contemplation.store.layout import Conv, read_metadata
from contemplation.writer.tasks import TASKS_DIR

MAX_SIBLINGS = 256  # task records read to rank tasks that sent the same text at once
TAIL_CHARS = 4096  # of a message's text kept as its fingerprint (sha256 of the stripped tail)


@dataclass(frozen=True, slots=True)
class Portion:
    """Where a task's turn is in the log: ``start`` (the cursor its result reads from),
    ``end`` (the next own block's cursor: the turn is over; None while it may go on) and
    ``found`` (its message is in the log, or it has none)."""

    start: int
    end: int | None
    found: bool


def fingerprint(text: str) -> dict[str, Any]:
    """What a task keeps to know its message's block by (never the text itself)."""
    tail = text.strip()[-TAIL_CHARS:]
    return {"text_sha": hashlib.sha256(tail.encode()).hexdigest(), "text_len": len(tail)}


def _matches(block_text: str, sha: str, n: int) -> bool:
    body = block_text.strip()
    return len(body) >= n and hashlib.sha256(body[len(body) - n :].encode()).hexdigest() == sha


def _rank(conv: Conv, secret: str, record: dict[str, Any]) -> int:
    """How many tasks on ``conv`` sent the same text before this one whose message may be
    among this one's candidates (the blocks from its ``since`` on): not one sent from a later
    cursor, nor one whose message was found before this ``since``."""
    mine = (str(record.get("queued") or ""), float(record.get("created") or 0.0), secret)
    since = int(record.get("since") or 0)
    before = 0
    try:
        paths = sorted((conv.dir / TASKS_DIR).glob("*.json"))[:MAX_SIBLINGS]
    except OSError:
        return 0
    for path in paths:
        if path.stem == secret:
            continue
        try:
            other = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(other, dict) or other.get("withdrawn"):
            continue
        if other.get("text_sha") != record.get("text_sha"):
            continue
        if int(other.get("since") or 0) > since:
            continue  # sent after this one's cursor moved on: its message comes later
        seen = other.get("at")
        if isinstance(seen, int) and seen < since:
            continue  # its message is before this task's cursor: not among the candidates
        key = (str(other.get("queued") or ""), float(other.get("created") or 0.0), path.stem)
        before += key < mine
    return before


def locate(conv: Conv, secret: str, record: dict[str, Any]) -> Portion:
    """The task's part of the log as it is now (see the module doc). Updates ``record`` with
    what was found (``at``, ``end``); the caller keeps it."""
    since = int(record.get("since") or 0)
    at = record.get("at")
    sha, n = record.get("text_sha"), record.get("text_len")
    known = isinstance(at, int)
    if isinstance(record.get("end"), int) and (known or not isinstance(sha, str)):
        return Portion(at if isinstance(at, int) else since, int(record["end"]), True)
    meta = read_metadata(conv)
    label = meta.agent_label if meta else "CLAUDE"
    blocks = blocks_since(conv, at if isinstance(at, int) else since, agent_label=label).blocks
    mine = [
        b
        for b in blocks
        if own(str(b.get("kind")), "response_to" in b, str(b.get("text", "")))
        and int(b["offset"]) >= since
    ]
    if not isinstance(at, int) and isinstance(sha, str) and isinstance(n, int):
        same = [b for b in mine if _matches(str(b.get("text", "")), sha, n)]
        rank = _rank(conv, secret, record)
        if rank >= len(same):
            return Portion(since, None, False)  # not taken yet (or not ours to tell)
        at = int(same[rank]["offset"])
        record["at"] = at
    start = at if isinstance(at, int) else since
    later = [int(b["offset"]) for b in mine if int(b["offset"]) > start]
    if later:
        record["end"] = later[0]
    return Portion(start, later[0] if later else None, True)


def trimmed(out: dict[str, Any], end: int) -> dict[str, Any]:
    """``conversation_check``'s result cut at ``end`` (the next question's message): what
    follows is another task's, and what waits now is that turn's."""
    out["blocks"] = [b for b in out.get("blocks", []) if int(b.get("offset", 0)) < end]
    if int(out.get("cursor") or 0) >= end:
        out["cursor"] = end
        out.pop("cut", None)
    out.pop("in_progress", None)
    out["waiting"] = []
    out.pop("hint", None)
    return out


def without_redone(out: dict[str, Any]) -> dict[str, Any]:
    """A task's result without the drafts that were redone: a model block marked INTERRUPTED
    (a crash, a lost connection cut it) followed in the result by another reply from the same
    model is not the answer, and carried beside it it says the same words twice. A draft
    nothing redid yet stays: it is all there is."""
    later: set[str] = set()
    kept: list[dict[str, Any]] = []
    for b in reversed(out.get("blocks", [])):
        if b.get("kind") == "model":
            sender = str(b.get("from", ""))
            if b.get("interrupted") and sender in later:
                continue
            later.add(sender)
        kept.append(b)
    out["blocks"] = kept[::-1]
    return out
