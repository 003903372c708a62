"""What ``contemplation watch`` says: one line per finished reply or per lookup or need that
waits, for the conversations the agent started (issue 44: wake the agent where tasks do not
reach — Claude Code's plugin monitor runs it, and every line it prints reaches the model).

A conversation records who started it in metadata.json ``started_by``: ``mcp`` (the MCP
server's ``conversation_start``) or ``claude-code`` (the CLI run from Claude Code's Bash tool,
which sets ``CLAUDECODE=1`` in its commands' environment); a person's ``contemplation new``
records nothing. :class:`Watch` reads only files (state.json, metadata.json), so it needs no
daemon and keeps watching while none runs. Each poll looks at a bounded number of
conversations and remembers one small fingerprint per conversation; a line is at most
``MAX_LINE`` characters and says what to call next (the MCP tool for a conversation the MCP
server started, the CLI command otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from contemplation.base.terminal import safe
from contemplation.models import BUSY, State, Status
from contemplation.protocol.logformat import one_line
from contemplation.store.layout import (
    Conv,
    Home,
    list_conversations,
    queued_messages,
    read_metadata,
    read_state,
)
from contemplation.store.waiting import WaitItem, how

STARTED_BY = "started_by"  # metadata.json: the agent's face that started it ("mcp", ...)
AGENT_ENV = "CLAUDECODE"  # set by Claude Code in the environment of the commands it runs
MAX_CONVERSATIONS = 1_000  # looked at per poll (the newest ids first)
MAX_LINE = 600
#: statuses in which the conversation waits for the agent, and so is worth a line
_SAID = {
    Status.IDLE: "replied",
    Status.AWAITING_AGENT: "waits for an answer",
    Status.AWAITING_APPROVAL: "waits for an approval",
    Status.ERROR: "stopped with an error",
}


def started_by(env: Mapping[str, str]) -> str | None:
    """Who starts a conversation from the CLI: ``claude-code`` inside Claude Code's Bash tool,
    else nobody in particular (None)."""
    return "claude-code" if env.get(AGENT_ENV) else None


@dataclass(slots=True)
class Watch:
    """Polls the home; :meth:`poll` returns the lines of what changed since the last poll.
    The first poll only takes note: what was already so is not news."""

    home: Home
    agent_only: bool = True
    seen: dict[str, tuple[str, int, tuple[str, ...]]] = field(default_factory=dict)
    at_work: set[str] = field(default_factory=set)  # busy, or a message queued
    primed: bool = False

    def _ids(self) -> list[str]:
        newest = reversed(list_conversations(self.home))
        return [c.id for c in newest][:MAX_CONVERSATIONS]

    def poll(self) -> list[str]:
        out: list[str] = []
        now: dict[str, tuple[str, int, tuple[str, ...]]] = {}
        at_work: set[str] = set()
        for cid in self._ids():
            conv = self.home.conv(cid)
            meta = read_metadata(conv)
            if meta is None:
                continue
            by = str((meta.model_extra or {}).get(STARTED_BY) or "")
            if self.agent_only and not by:
                continue
            state = read_state(conv)
            if state is None:
                continue
            pending = tuple(r.id for r in state.pending_approvals)
            mark = (state.status.value, state.log.size, pending)
            now[cid] = mark
            if state.status in BUSY or queued_messages(conv):
                at_work.add(cid)
            if self.primed and self.seen.get(cid) != mark and state.status in _SAID:
                out.append(self._line(conv, meta.topic, by, state.status, state))
        self.seen, self.at_work, self.primed = now, at_work, True
        return out

    def busy(self) -> list[str]:
        """The conversations at work (a turn running or a message queued), as last polled."""
        return sorted(self.at_work)

    @staticmethod
    def _line(conv: Conv, topic: str, by: str, status: Status, state: State) -> str:
        mcp = by == "mcp"
        head = f"contemplation: {conv.id} ({one_line(topic, 60)}) {_SAID[status]}"
        if status is Status.AWAITING_APPROVAL and state.pending_approvals:
            r = state.pending_approvals[0]
            item = WaitItem(r.id, "approval", r.need, r.tool, r.arguments, r.why)
            nxt = f"lookup {r.tool} ({one_line(r.need, 80)}); the person decides: " + how(
                item, conv.id, "cli"
            )
        elif mcp:
            nxt = f'read it: conversation_check(conversation_id="{conv.id}")'
        else:
            nxt = f"read it: contemplation wait {conv.id}"
        text = safe(f"{head}: {nxt}")
        return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"
