"""Waiting from a shell: ``send --wait``, ``respond --wait``, ``approve --wait``,
``new --message … --wait`` and ``contemplation wait`` stream one exchange to stdout and end
with the same exit codes (0 done, 1 the turn failed, 3 the model waits for the agent, 4 the
time ran out, 5 the reply was stopped before its end: a loop, or the token limit).

An exchange is what one message of the agent started: its own block, the model's replies and
the rules' answers after it. Only that is printed: when an earlier reply is still being
written as the message is sent, one line on stderr says so and its tail is not printed.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from contemplation.base.terminal import safe
from contemplation.faces.cli import show
from contemplation.faces.cli.common import (
    EXIT_CUT,
    EXIT_ERROR,
    EXIT_NEEDS_AGENT,
    EXIT_OK,
    EXIT_TIMEOUT,
    face,
)
from contemplation.faces.reading import Reader, Standing, own, segments
from contemplation.models import MarkerKind, Status
from contemplation.protocol import escalation, logformat
from contemplation.store import waiting
from contemplation.store.layout import (
    Conv,
    Home,
    open_regular,
    read_state,
)
from contemplation.writer import conv_lock, daemon_alive

POLL = 0.1  # seconds between looks at the folder while following or waiting


class Follower:
    """What is appended to a conversation's live log, as text safe for a terminal: across a
    rotation (a new file) and an archive (the folder moves); a character split between two
    reads is decoded whole."""

    CHUNK = 1 << 20  # bytes read at a time

    def __init__(self, home: Home, conv: Conv, offset: int | None = None) -> None:
        self.home = home
        self.conv = conv = current(home, conv)  # archived or reopened since it was looked up
        st = stat_or_none(conv.log)
        self.ino = st.st_ino if st else 0
        self.offset = (st.st_size if st else 0) if offset is None else offset
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self) -> str:
        self.conv = current(self.home, self.conv)
        st = stat_or_none(self.conv.log)
        if st is None:
            return ""
        if st.st_ino != self.ino or st.st_size < self.offset:
            self.ino, self.offset = st.st_ino, 0  # rotated or replaced: follow the new file
        if st.st_size <= self.offset:
            return ""
        with os.fdopen(open_regular(self.conv.log), "rb") as f:
            f.seek(self.offset)
            chunk = f.read(self.CHUNK)
        self.offset += len(chunk)
        return safe(self.decoder.decode(chunk))

    def drain(self) -> None:
        """Print everything appended so far."""
        while text := self.read():
            sys.stdout.write(text)
        sys.stdout.flush()


def _being_written(conv: Conv) -> bool:
    """A writer holds the conversation's lock (the daemon holds it for a whole reply): a
    state that says generating after a crash is no reply being written."""
    with conv_lock(conv, blocking=False, shared=True) as got:
        return not got


def stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def current(home: Home, conv: Conv) -> Conv:
    """The conversation where it is now: it moves to completed/ when archived, and back to
    active/ when reopened (a follower keeps up with both moves)."""
    if conv.dir.exists():
        return conv
    other = home.conv(conv.id, completed=not conv.is_completed)
    return other if other.dir.exists() else conv


@dataclass
class Exchange:
    """Where the exchange to print begins. ``text``: the agent's words that start it (found
    as the end of an own block after ``after``); None: it begins at ``after`` itself (an
    approval, or ``wait`` from the agent's last own message)."""

    after: int  # a cursor (see reading): nothing before it belongs to the exchange
    text: str | None = None
    before: int = -1  # messages_processed when it was sent (-1: no message of its own)
    request: str = ""  # approve --wait: the lookup whose decision the daemon must act on
    queued: str = ""  # the inbox name of its message: refused into failed/, the wait ends
    latest: bool = False  # `wait`: a refusal after the last own message ends the exchange


def begin(
    reader: Reader, conv: Conv, text: str | None, *, wait: bool, request: str = ""
) -> Exchange:
    """Taken just before the agent's write: where its exchange can begin, and, when the
    exchange will be printed (``wait``), a line on stderr when an earlier reply is still being
    written (its tail is not this exchange's)."""
    state = read_state(conv)
    after = reader.boundary(conv)
    segs = segments(conv)
    if (
        wait
        and segs
        and segs[-1].end > after
        and state is not None
        and state.status is Status.GENERATING
        and _being_written(conv)
    ):
        click.echo(
            "note: an earlier reply is still being written; this prints only the exchange "
            "this message starts",
            err=True,
        )
    before = state.messages_processed if state is not None and text is not None else -1
    return Exchange(after, text, before, request)


def _start(reader: Reader, conv: Conv, ex: Exchange) -> int | None:
    """The live-log offset the exchange's output starts at, once it is in the log."""
    segs = segments(conv)
    if not segs:
        return None
    live = segs[-1]
    if ex.text is None:
        return max(0, ex.after - live.start)
    got = reader.since(conv, ex.after)
    want = ex.text.strip()
    blocks = [*got.blocks, *([got.partial] if got.partial else [])]
    for b in blocks:
        body = str(b.get("text", ""))
        if own(str(b.get("kind")), "response_to" in b, body) and body.rstrip().endswith(want):
            offset = int(b["offset"])
            return offset - live.start if offset >= live.start else 0
    return None


def follow(
    reader: Reader, conv: Conv, ex: Exchange, timeout: float, *, as_json: bool = False
) -> int:
    """Stream the exchange until the daemon is done with it; the exit code. ``as_json``:
    print nothing meanwhile, then the exchange as one JSON object (:func:`result`)."""
    if as_json:
        return _follow_json(reader, conv, ex, timeout)
    home = reader.home
    deadline = time.monotonic() + timeout if timeout else None
    follower: Follower | None = None
    while True:
        conv = current(home, conv)
        if follower is None:
            at = _start(reader, conv, ex)
            if at is not None:
                follower = Follower(home, conv, offset=at)
        if follower is not None:
            follower.drain()
            conv = follower.conv
        code, view = outcome(reader, conv, ex)
        why = refused(reader, conv, ex, view, settled=code is not None)
        if why is not None:
            code = EXIT_ERROR
        if code is not None:
            if follower is None and (at := _start(reader, conv, ex)) is not None:
                follower = Follower(home, conv, offset=at)
            if follower is not None:
                follower.drain()
            return report(conv, code, view, refused=why)
        if deadline is not None and time.monotonic() > deadline:
            return timed_out(reader, conv, timeout)
        time.sleep(POLL)


def _follow_json(reader: Reader, conv: Conv, ex: Exchange, timeout: float) -> int:
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        conv = current(reader.home, conv)
        code, view = outcome(reader, conv, ex)
        why = refused(reader, conv, ex, view, settled=code is not None)
        if why is not None:
            code = EXIT_ERROR
        if code is None and deadline is not None and time.monotonic() > deadline:
            code = timed_out(reader, conv, timeout)
        if code is not None:
            if code != EXIT_TIMEOUT:
                report(conv, code, view, refused=why)
            out = result(reader, conv, ex, code)
            if why is not None:
                out["error"] = why
            click.echo(json.dumps(out, ensure_ascii=False))
            return code
        time.sleep(POLL)


def result(reader: Reader, conv: Conv, ex: Exchange, code: int) -> dict[str, Any]:
    """The exchange as data: the blocks after the agent's own (the replies, the rules'
    answers), the last reply's ``text`` and, when it matched its schema, its ``parsed``
    JSON value."""
    blocks = reader.since(conv, ex.after).blocks
    want = ex.text.strip() if ex.text is not None else None
    for i, b in enumerate(blocks):
        body = str(b.get("text", ""))
        if own(str(b.get("kind")), "response_to" in b, body) and (
            want is None or body.rstrip().endswith(want)
        ):
            blocks = blocks[i + 1 :]  # the agent's own block: the exchange is what follows
            break
    state = read_state(conv)
    out: dict[str, Any] = {
        "conversation_id": conv.id,
        "status": state.status.value if state is not None else None,
        "exit_code": code,
        "blocks": blocks,
    }
    replies = [b for b in blocks if b.get("kind") == "model"]
    ups = [b["escalated"] for b in replies if "escalated" in b]
    if ups:  # the escalation ladder: each rung the exchange went up, and why
        out["escalated"] = ups
    if replies and "rung" in replies[-1]:
        out["rung"] = replies[-1]["rung"]
    if replies:
        out["text"] = replies[-1]["text"]
        if "parsed" in replies[-1]:
            out["parsed"] = replies[-1]["parsed"]
    if state is not None and state.last_error is not None and code == EXIT_ERROR:
        out["error"] = state.last_error.message
    if state is not None and state.reply_cut is not None:
        out["reply_cut"] = state.reply_cut.model_dump()
    return out


def outcome(reader: Reader, conv: Conv, ex: Exchange) -> tuple[int | None, Standing]:
    """The exit code, None while the daemon still works on the exchange (``Standing.settled``,
    the rule every face shares, and this exchange's own message or decision taken), and the
    reading it was judged on (:meth:`Reader.standing`): what the end reports as waiting is
    what made it end."""
    view = reader.standing(conv)
    return _code(view, ex), view


def _code(view: Standing, ex: Exchange) -> int | None:
    state = view.state
    if state is None or not view.settled:
        return None
    if ex.before >= 0 and state.messages_processed <= ex.before:
        return None  # the message is not in the log yet
    if ex.request and any(r.id == ex.request for r in state.pending_approvals):
        return None  # the daemon has not acted on the decision yet
    if state.status in (Status.AWAITING_AGENT, Status.AWAITING_APPROVAL):
        return EXIT_NEEDS_AGENT
    if state.status in (Status.CANCELLED, Status.ERROR):
        return EXIT_ERROR
    if state.reply_cut is not None:  # the last reply is not whole
        return EXIT_CUT
    return EXIT_OK


def refused(
    reader: Reader, conv: Conv, ex: Exchange, view: Standing, *, settled: bool
) -> str | None:
    """Why the daemon refused the exchange's message into failed/ (the log's NOTE marker,
    :func:`logformat.refusal`), as stderr says it; None when it did not. A refusal is final,
    so it ends the wait at once: ``send --wait`` knows its message by its inbox name
    (looked for only once it has left inbox/ without becoming a block); ``wait``, once the
    daemon is done (``settled``), ends on one that is the last thing in the log."""
    if ex.queued:
        state = view.state
        taken = state is not None and state.messages_processed > max(ex.before, 0)
        if taken or conv.is_completed or os.path.lexists(conv.inbox / ex.queued):
            return None
        found = [r for r in _refusals(reader, conv, ex.after) if r[0].endswith(f"-{ex.queued}")]
    elif ex.latest and settled:
        found = _refusals(reader, conv, ex.after, last=True)
    else:
        return None
    if not found:
        return None
    _, why, kept = found[-1]
    where = f" (kept in failed/{kept})" if kept else ""
    return f"the daemon refused the message{where}: {why}"


def _refusals(
    reader: Reader, conv: Conv, after: int, *, last: bool = False
) -> list[tuple[str, str, str]]:
    """The refusals the log's NOTE markers after ``after`` tell of, in order; ``last``: only
    the last marker of the last block (a refusal nothing came after)."""
    blocks = reader.since(conv, after).blocks
    if last:
        blocks = blocks[-1:]
    marks: list[tuple[str, str]] = []
    for b in blocks:
        if b.get("kind") == "marker":  # a loose one, after the cursor: an earlier block's
            marks.append((str(b.get("marker")), str(b.get("text", ""))))
        else:
            marks.extend((str(k), str(t)) for k, t in b.get("markers", []))
    if last:
        marks = marks[-1:]
    return [
        r
        for kind, text in marks
        if kind == MarkerKind.NOTE.value and (r := logformat.refusal(text)) is not None
    ]


def report(conv: Conv, code: int, view: Standing, *, refused: str | None = None) -> int:
    """What stderr says at the end: why the message was refused, what waits for the agent
    (with the commands), or why the turn failed; from ``view``, the reading the end was
    judged on."""
    state = view.state
    if refused is not None:
        click.echo(safe(f"error: {refused}"), err=True)
        if view.items:  # still there, and the refused message answered none of them
            click.echo("\n".join(waiting.lines(conv.id, view.items, face())), err=True)
    elif code == EXIT_NEEDS_AGENT:
        items = view.items
        told = waiting.lines(conv.id, items, face()) or [
            f"{conv.id} waits for the agent: see `contemplation status {conv.id}`"
        ]
        click.echo("\n".join(told), err=True)
    elif code == EXIT_OK and state is not None and (rung := escalation.last_rung(state.ladder)):
        click.echo(safe(f"rung: {rung}"), err=True)  # which rung of the ladder answered
    elif code == EXIT_CUT and state is not None and state.reply_cut is not None:
        click.echo(safe(f"cut: {state.reply_cut.message}"), err=True)
    elif code == EXIT_ERROR and state is not None:
        if state.status is Status.CANCELLED:
            click.echo("error: the turn was cancelled", err=True)
        else:
            why = state.last_error.message if state.last_error else "the turn failed"
            click.echo(safe(f"error: {why}"), err=True)
    return code


def timed_out(reader: Reader, conv: Conv, waited: float) -> int:
    view = reader.standing(conv)  # what is happening, in the words of status, MCP, dashboard
    line = show.still_running(conv.id, view.state, waited=waited, now=reader.activity(conv, view))
    click.echo(f"error: {line}", err=True)
    return EXIT_TIMEOUT


def note_no_daemon(home: Home) -> None:
    if not daemon_alive(home):
        click.echo(
            "note: no daemon is running on this home; start one with `contemplation run`", err=True
        )
