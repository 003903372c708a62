"""What a conversation is doing right now, in one line of plain words: the same line on every
face (``status``, ``send --wait`` when time runs out, MCP progress and ``check``, the
dashboard). Pure: it is handed what the faces have already read, state.json as the model dumps
it (:func:`contemplation.store.plain.state`: a read command reads it without the models).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from contemplation.protocol import escalation
from contemplation.values import BUSY, Status


def queued_behind(conv_id: str, backend: str, model: str, rows: Iterable[Mapping[str, Any]]) -> int:
    """Turns of other conversations running on the same backend and model (the slots a queued
    message waits for), from the summaries' rows."""
    return sum(
        1
        for r in rows
        if r.get("id") != conv_id
        and r.get("backend") == backend
        and r.get("model") == model
        and r.get("status") in {Status.GENERATING.value, Status.ROUTING.value}
    )


def archived(status: str) -> str:
    """The line of a conversation in completed/: finished, never stalled or queued, since no
    daemon answers there. ``status``: its summary's (which knows a folder made by hand from
    its log), where "pending" is a last message nobody answers."""
    if status == Status.PENDING.value:
        return "archived: the last message got no answer; reopen to have it answered"
    return "archived: reopen to go on with it"


def _held(disk_full: str) -> str:
    if disk_full:
        return f"retrying: {disk_full}; the turn is redone whole once there is room"
    return "stalled: no daemon is running (messages stay queued until one starts)"


#: how a reply stopped before its end (state.json ``reply_cut.reason``), as every face says it
CUT_WORDS = {
    "repeating": "for repeating itself (a loop): `continue` or a message goes on",
    "length": "at the token limit: `continue` has the model go on",
    "bytes": "at max_reply_bytes",
    "time": "at its time budget (escalation.time_budget)",
}


def _idle(state: Mapping[str, Any] | None) -> str:
    cut = state["reply_cut"] if state is not None else None
    if cut is not None:  # a reply that is not whole
        return f"idle: the last reply was stopped {CUT_WORDS[cut['reason']]}"
    book = state.get("ladder") if state is not None else None
    if book is not None and book["steps"]:  # the escalation ladder: which rung answered
        return f"idle: waiting for your next message; {escalation.step_words(book['steps'][-1])}"
    return "idle: waiting for your next message"


def _failed(state: Mapping[str, Any] | None) -> str:
    book = state.get("ladder") if state is not None else None
    if book is not None and book["steps"] and book["steps"][-1]["to"] == escalation.AGENT:
        return f"the last turn failed: {escalation.step_words(book['steps'][-1])}"  # the top
    return "the last turn failed"


def describe(
    state: Mapping[str, Any] | None,
    *,
    model: str,
    daemon: bool,
    queued: int,
    behind: int = 0,
    written: int | None = None,
    waiting: tuple[int, int] = (0, 0),
    now: float | None = None,
    disk_full: str = "",
) -> str:
    """The line of an active conversation (an archived one's: :func:`archived`). ``queued``:
    messages in inbox/ or processing/; ``behind``: turns ahead of it on the same model
    (:func:`queued_behind`); ``written``: characters of the reply streamed so far (None: no
    reply is being written); ``waiting``: (needs, lookups) that wait for the agent;
    ``disk_full``: :func:`contemplation.store.room.full` (the turn cannot be written, whatever
    the state the daemon could not write says)."""
    now = time.time() if now is None else now
    status = Status(state["status"]) if state is not None else Status.PENDING
    needs, lookups = waiting
    if lookups:
        what = f"waiting for your approval of {lookups} lookup(s)"
        return what + (f" and your answer to {needs} need(s)" if needs else "")
    if needs:
        return f"waiting for your answer to {needs} need(s)"
    busy = status in BUSY or queued > 0
    if busy and (disk_full or not daemon):  # the disk: whatever the unwritable state says
        return _held(disk_full if daemon else "")
    if status in {Status.AWAITING_AGENT, Status.AWAITING_APPROVAL}:  # and nothing waits now
        if not daemon:
            return "stalled: no daemon is running (what you decided waits until one starts)"
        return "carrying on with what you decided"
    if status is Status.GENERATING and state is not None:
        since = state["generating_since"]
        took = f" for {max(0.0, now - since):.0f} s" if since else ""
        if not written:
            return f"generating{took}: waiting for {model}'s first token (loading the model?)"
        rate = ""
        if since and now > since:
            rate = f", {written / 4 / (now - since):.0f} tok/s"
        return f"generating{took}: ~{written // 4:,} tokens so far ({written:,} characters{rate})"
    if status is Status.ROUTING:
        return "looking up what the model asked for (NEED lines)"
    if status is Status.RETRYING and state is not None:
        err = state["last_error"]["message"] if state["last_error"] else "a transient error"
        wait = max(0.0, (state["next_retry_at"] or now) - now)
        return f"retry {state['retry_count']} in {wait:.0f} s after: {err}"
    if queued or status is Status.PENDING:
        if behind:
            return f"queued behind {behind} turn(s) on {model}"
        return "queued: the daemon takes it next" if queued else "nothing to do yet"
    return {
        Status.IDLE: _idle(state),
        Status.COMPLETE: "complete",
        Status.ERROR: _failed(state),
        Status.CANCELLED: "the last turn was cancelled",
    }.get(status, status.value)
