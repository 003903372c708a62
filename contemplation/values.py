"""Leaf module: the values the rest of the package passes around in memory, and the names of
states and kinds, without pydantic: what a read command needs (a status, a parsed block) loads
nothing more. The on-disk documents (``metadata.json``, ``state.json``) are the pydantic models
of :mod:`contemplation.models`, which re-exports everything here.
Nothing here imports from the package.
"""

from __future__ import annotations

import enum
import json
import re
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args


class Status(enum.StrEnum):
    PENDING = "pending"
    GENERATING = "generating"
    ROUTING = "routing"
    AWAITING_AGENT = "awaiting_agent"
    AWAITING_APPROVAL = "awaiting_approval"  # a need's tool waits for the agent's permission
    RETRYING = "retrying"
    CANCELLED = "cancelled"
    COMPLETE = "complete"
    ERROR = "error"
    IDLE = "idle"  # the model has answered and nothing is queued


# Statuses the faces group by (the daemon sets them; see docs/reference/format.md):
#: the daemon is done for now; the next move is the agent's (``send --wait`` returns here)
SETTLED = frozenset({
    Status.IDLE, Status.AWAITING_AGENT, Status.AWAITING_APPROVAL, Status.COMPLETE, Status.ERROR,
    Status.CANCELLED,
})  # fmt: skip
#: a turn is queued, running, looking up needs or waiting to retry
BUSY = frozenset({Status.PENDING, Status.GENERATING, Status.ROUTING, Status.RETRYING})
#: what ``cancel`` can stop (a pending message has no turn yet)
CANCELLABLE = frozenset({Status.GENERATING, Status.ROUTING, Status.RETRYING})


class BlockKind(enum.StrEnum):
    AGENT = "agent"  # written by the agent side (a message or a RESPONSE TO NEED)
    MODEL = "model"  # written by the model side


class ConvEvent(enum.StrEnum):
    """What the daemon tells its observers (the dashboard's live feed, notifications, the
    index keeper) about a conversation: one spelling, checked by the type checker."""

    MESSAGE = "message"  # an agent's message is in the log
    GENERATING = "generating"  # a turn took its backend slot
    TOKEN = "token"  # noqa: S105 - reply text streamed, not a secret
    THINKING = "thinking"  # thinking streamed
    REPLY = "reply"  # a reply was committed
    NOTE = "note"
    ERROR = "error"
    RETRYING = "retrying"
    CANCELLED = "cancelled"
    AWAITING_AGENT = "awaiting_agent"
    AWAITING_APPROVAL = "awaiting_approval"
    NEED_ANSWERED = "need_answered"
    REJECTED = "rejected"  # an input file that could not be a message
    ARCHIVED = "archived"


class MarkerKind(enum.StrEnum):
    """System lines of the form ``=== WORD[: text] ===`` (never a header)."""

    COMPLETE = "COMPLETE"
    INTERRUPTED = "INTERRUPTED"
    ERROR = "ERROR"
    WARNING = "WARNING"
    NOTE = "NOTE"
    CANCELLED = "CANCELLED"
    THINKING = "THINKING"
    END_THINKING = "END THINKING"
    CONTINUED = "CONTINUED"
    FORKED = "FORKED"  # a fork ends here and waits for the agent's next message
    RETRACTED = "RETRACTED"  # the agent withdrew the turn that ends here
    GO_ON = "GO ON"  # the agent asked the model to go on with the reply that ends here
    ESCALATED = "ESCALATED"  # the reply failed for a named cause: the ladder's next rung is due


Decision = Literal["once", "always", "reject"]
DECISIONS: frozenset[str] = frozenset(get_args(Decision))
APPROVALS_KEY = "approvals"  # metadata.json: the agent's ApprovalDecisions
# The face a decision came through: "mcp" is the agent's conversation_approve, "form" the
# person's answer to the form their MCP client showed them, "cli" and "dashboard" the person's;
# "agent-cli" the CLI run by an agent from its shell tool (contemplation.base.acting)
Decider = Literal["cli", "mcp", "dashboard", "form", "agent-cli"]
DECIDERS: dict[str, str] = {
    "mcp": "the agent (conversation_approve)",
    "form": "the person (their MCP client's form)",
    "cli": "the person (the CLI)",
    "dashboard": "the person (the dashboard)",
    "agent-cli": "the agent (the CLI)",
}


def decider(face: str, agent: str = "") -> str:
    """Who took a decision through ``face``, in words (``agent``: which agent ran the CLI)."""
    if face == "agent-cli" and agent:
        return f"the agent (the CLI under {agent})"
    return DECIDERS.get(face, face or "unknown")


def grants(decision: str, revoked: str) -> bool:
    """An ``always`` not revoked: it lets the same lookup through from now on."""
    return decision == "always" and not revoked


CutReason = Literal["repeating", "length", "bytes", "time"]


# a conversation's first turn, a compaction that changed the prompt's start, its slot taken by
# another conversation, a slot file whose restore did not hold, other tools offered, the prompt
# cut (by the server or to fit), its history changed otherwise (a retraction, an edit), or,
# after a restart, its slot file made by another model or given up to another conversation
MissCause = Literal[
    "new conversation", "compaction", "slot taken", "restore failed", "tools changed", "cut",
    "history changed", "model changed", "file evicted",
]  # fmt: skip


# --------------------------------------------------------------------------- in memory


@dataclass(frozen=True, slots=True)
class Block:
    """One block of ``messages.log``."""

    sender: str
    recipient: str
    timestamp: str
    kind: BlockKind
    text: str  # body with stuffing removed; thinking sections excluded
    offset: int  # byte offset of the header line
    end: int  # byte offset just past the block (next header or EOF)
    thinking: str = ""
    needs: tuple[str, ...] = ()
    images: tuple[ImageRef, ...] = ()  # an agent block's: its writer's [attachment: …] lines
    response_to: str | None = None  # set for "RESPONSE TO NEED: ..." agent blocks
    responds: tuple[str, ...] = ()  # every need the block answers (response_to is the first)
    complete: bool = False  # the block carries a COMPLETE marker
    interrupted: bool = False  # followed by an INTERRUPTED marker (a cut-off reply)
    markers: tuple[tuple[MarkerKind, str], ...] = ()
    truncated: bool = False  # the file ended in the middle of the block's last line


@dataclass(frozen=True, slots=True)
class ParseResult:
    blocks: tuple[Block, ...]
    size: int  # bytes examined
    preamble: str = ""  # text before the first header (kept, not a message)
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image a message carries (an ``[attachment: …]`` line of its block): ``data`` is
    filled from ``<conv>/attachments/`` just before the request goes out."""

    name: str
    mime: str
    sha256: str
    data: bytes = b""

    def b64(self) -> str:
        """The bytes in standard base64 (with padding), as Ollama's ``images`` takes them."""
        return b64encode(self.data).decode("ascii")

    def data_uri(self) -> str:
        """``data:<mime>;base64,<bytes>`` (OpenAI ``image_url``, OpenCode file parts)."""
        return f"data:{self.mime};base64,{self.b64()}"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    images: tuple[ImageRef, ...] = ()


# --------------------------------------------------------------------------- NEED rules

Action = Literal["allow", "ask", "deny"]  # a permission (see needs/permissions.py)
ACTIONS: tuple[Action, ...] = ("allow", "ask", "deny")
FUNCTION_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")  # a rule's name as a native tool


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    tool: str
    args: Mapping[str, Any]
    prefix: str = ""
    pattern: re.Pattern[str] | None = None
    param: str = "query"  # the capture a prefix rule gives the text after the prefix
    description: str = ""
    source: str = "built in"

    @property
    def params(self) -> tuple[str, ...]:
        """The values a caller supplies (native tool calls): captures, or the prefix's param."""
        if self.pattern is not None:
            return tuple(self.pattern.groupindex)
        return (self.param,)

    @property
    def function(self) -> str | None:
        """The name under which the rule is offered as a native tool (None: not offered)."""
        return self.name if FUNCTION_RE.match(self.name) and self.tool != "agent" else None

    def describe(self) -> str:
        how = (
            f"prefix {self.prefix!r}" if self.pattern is None else f"match {self.pattern.pattern!r}"
        )
        return f"{self.name}: {how} -> {self.tool} {json.dumps(dict(self.args))} ({self.source})"


@dataclass(frozen=True, slots=True)
class Route:
    rule: Rule
    need: str
    tool: str
    arguments: dict[str, Any]
    captures: dict[str, str] = field(default_factory=dict)
    verdict: Action = "allow"  # its permission: "ask" waits for the agent, "deny" is refused
    why: str = ""  # what decided it (a permission rule, the agent)
