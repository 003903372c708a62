"""What ``contemplation watch`` says: one line per finished reply or per lookup or need that
waits, for the conversations the agent started (wake the agent where tasks do not reach —
Claude Code's plugin monitor runs it, and every line it prints reaches the model).

A conversation records who started it in metadata.json ``started_by``: ``mcp`` (the MCP
server's ``conversation_start``) or ``claude-code`` (the CLI run from Claude Code's Bash tool,
which sets ``CLAUDECODE=1`` in its commands' environment), and ``started_in``, the agent's
own process (:func:`contemplation.base.acting.session`); a person's ``contemplation new``
records neither. The agent's watch follows only its own session's conversations, and wakes
the agent once per reply: a conversation an MCP task follows is told by the task's
notification, so the watch says only what the task cannot — a decision the person took on
another face while the task's form was out. :class:`Watch` reads only files (state.json,
metadata.json), so it needs no daemon. Each conversation's metadata is read once (a new
one when it appears, again only when the file changes), each poll looks at a bounded number
of followed conversations, and a line is at most ``MAX_LINE`` characters. Lines are read by
the agent: they never hold a command that decides a lookup, only where the person decides.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from contemplation.base import acting
from contemplation.base.terminal import safe
from contemplation.models import BUSY, Metadata, State, Status
from contemplation.protocol.logformat import one_line
from contemplation.store.layout import (
    Conv,
    Home,
    list_conversations,
    queued_messages,
    read_metadata,
    read_state,
)
from contemplation.store.waiting import PERSON_DECIDES, VERBS
from contemplation.writer.tasks import TASKS_DIR

STARTED_BY = "started_by"  # metadata.json: the agent's face that started it ("mcp", ...)
STARTED_IN = "started_in"  # metadata.json: the agent's process (acting.session)
AGENT_ENV = "CLAUDECODE"  # set by Claude Code in the environment of the commands it runs
MAX_FOLLOWED = 5_000  # conversations followed per poll (the newest ids first)
MAX_NEW = 20_000  # conversations whose metadata one poll reads for the first time
MAX_LINE = 600
MAX_TASK = 64 * 1024  # characters of a task record read
ELSEWHERE = {"cli": "in their terminal", "dashboard": "on the dashboard"}  # the person's faces
#: statuses in which the conversation waits for the agent, and so is worth a line
_SAID = {
    Status.IDLE: "replied",
    Status.AWAITING_AGENT: "waits for an answer",
    Status.AWAITING_APPROVAL: "waits for the person's approval",
    Status.ERROR: "stopped with an error",
}


def started_by(env: Mapping[str, str]) -> str | None:
    """Who starts a conversation from the CLI: ``claude-code`` inside Claude Code's Bash tool,
    else nobody in particular (None)."""
    return "claude-code" if env.get(AGENT_ENV) else None


@dataclass(slots=True)
class _Known:
    """What a conversation's metadata says for the watch, and the file's stamp it was read at."""

    stamp: tuple[int, int]
    by: str
    session: str
    topic: str
    decided: int  # the person's decisions taken on another face, so far


def _stamp(conv: Conv) -> tuple[int, int] | None:
    try:
        st = os.stat(conv.metadata)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _known(meta: Metadata, stamp: tuple[int, int]) -> _Known:
    extra = meta.model_extra or {}
    elsewhere = sum(1 for d in meta.approvals() if d.face in ELSEWHERE)
    return _Known(
        stamp, str(extra.get(STARTED_BY) or ""), str(extra.get(STARTED_IN) or ""), meta.topic,
        elsewhere,
    )  # fmt: skip


def _tasked(conv: Conv) -> bool:
    """Whether an MCP task follows the conversation (its notification carries the reply):
    its newest task's MCP server still runs. A task whose server died tells its client
    nothing until the client asks again, so the watch says the reply then."""
    try:
        with os.scandir(conv.dir / TASKS_DIR) as it:
            found = [(e.stat().st_mtime_ns, e.path) for e in it if e.name.endswith(".json")]
    except OSError:
        return False
    if not found:
        return False
    try:
        record = json.loads(Path(max(found)[1]).read_text(encoding="utf-8")[:MAX_TASK])
    except (OSError, ValueError):
        return True
    server = record.get("server") if isinstance(record, dict) else None
    return not isinstance(server, str) or acting.alive(server)  # an older record: it runs


@dataclass(slots=True)
class Watch:
    """Polls the home; :meth:`poll` returns the lines of what changed since the last poll.
    The first poll only takes note: what was already so is not news. ``session``: follow
    only the conversations that agent process started (None: every agent's)."""

    home: Home
    agent_only: bool = True
    session: str | None = None
    seen: dict[str, tuple[str, int, tuple[str, ...]]] = field(default_factory=dict)
    known: dict[str, _Known] = field(default_factory=dict)
    at_work: set[str] = field(default_factory=set)  # busy, or a message queued
    primed: bool = False

    def _followed(self) -> list[Conv]:
        listed = list_conversations(self.home)
        ids = {c.id for c in listed}
        for gone in [cid for cid in self.known if cid not in ids]:
            del self.known[gone]
        fresh = 0
        out: list[Conv] = []
        for conv in reversed(listed):  # the newest first
            stamp = _stamp(conv)
            k = self.known.get(conv.id)
            if stamp is not None and (k is None or k.stamp != stamp) and fresh < MAX_NEW:
                fresh += 1
                meta = read_metadata(conv)
                if meta is not None:
                    k = self.known[conv.id] = _known(meta, stamp)
            if k is None or (self.agent_only and not k.by):
                continue
            if self.session is not None and k.session != self.session:
                continue
            out.append(conv)
            if len(out) >= MAX_FOLLOWED:
                break
        return out

    def poll(self) -> list[str]:
        out: list[str] = []
        now: dict[str, tuple[str, int, tuple[str, ...]]] = {}
        told = {cid: k.decided for cid, k in self.known.items()}
        at_work: set[str] = set()
        for conv in self._followed():
            k = self.known[conv.id]
            state = read_state(conv)
            if state is None:
                continue
            pending = tuple(r.id for r in state.pending_approvals)
            mark = (state.status.value, state.log.size, pending)
            now[conv.id] = mark
            if state.status in BUSY or queued_messages(conv):
                at_work.add(conv.id)
            if not self.primed:
                continue
            if k.by == "mcp" and _tasked(conv):  # the task tells the agent, but not this:
                if k.decided > told.get(conv.id, k.decided):
                    out.append(self._decided(conv, k))
                continue
            if self.seen.get(conv.id) != mark and state.status in _SAID:
                out.append(self._line(conv, k, state))
        self.seen, self.at_work, self.primed = now, at_work, True
        return out

    def busy(self) -> list[str]:
        """The conversations at work (a turn running or a message queued), as last polled."""
        return sorted(self.at_work)

    @staticmethod
    def _fit(text: str) -> str:
        text = safe(text)
        return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"

    def _decided(self, conv: Conv, k: _Known) -> str:
        """The person decided a lookup on another face while the task's form was out: the
        task says nothing until its form is answered, so the agent is told here, once."""
        meta = read_metadata(conv)
        given = meta.approvals() if meta is not None else []
        last = next((d for d in reversed(given) if d.face in ELSEWHERE), None)
        what = (
            f"the person {VERBS[last.decision]} lookup {last.tool} ({one_line(last.need, 80)})"
            f" {ELSEWHERE[last.face]}"
            if last is not None
            else "the person decided a lookup on another face"
        )
        return self._fit(
            f"contemplation: {conv.id} ({one_line(k.topic, 60)}): {what}; its form is answered: "
            f'read the reply: conversation_wait(conversation_id="{conv.id}")'
        )

    @staticmethod
    def _line(conv: Conv, k: _Known, state: State) -> str:
        status = state.status
        head = f"contemplation: {conv.id} ({one_line(k.topic, 60)}) {_SAID[status]}"
        if status is Status.AWAITING_APPROVAL and state.pending_approvals:
            r = state.pending_approvals[0]
            nxt = f"lookup {r.tool} ({one_line(r.need, 80)}); {PERSON_DECIDES}"
        elif k.by == "mcp":
            nxt = f'read it: conversation_check(conversation_id="{conv.id}")'
        else:
            nxt = f"read it: contemplation wait {conv.id}"
        return Watch._fit(f"{head}: {nxt}")
