"""The on-disk documents (``metadata.json``, ``state.json``) as pydantic models, and the
in-memory values that carry them (chat requests, stream events). The values that need no
pydantic (statuses, kinds, parsed blocks, rules) live in :mod:`contemplation.values` and are
re-exported here, so either name works; a module on a read command's path imports them from
there (importing pydantic costs more than such a command's whole work).
Nothing here imports from the package but :mod:`contemplation.values`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contemplation.values import (
    ACTIONS,
    APPROVALS_KEY,
    BUSY,
    CANCELLABLE,
    DECIDERS,
    FUNCTION_RE,
    SETTLED,
    Action,
    Block,
    BlockKind,
    ChatMessage,
    ConvEvent,
    CutReason,
    Decider,
    Decision,
    ImageRef,
    MarkerKind,
    MissCause,
    ParseResult,
    Route,
    Rule,
    Status,
    decider,
    grants,
)

__all__ = [  # the values' names, re-exported (see the module's docstring)
    "ACTIONS", "APPROVALS_KEY", "BUSY", "CANCELLABLE", "DECIDERS", "FUNCTION_RE", "SETTLED",
    "Action", "Block", "BlockKind", "ChatMessage", "ConvEvent", "CutReason", "Decider",
    "Decision", "ImageRef", "MarkerKind", "MissCause", "ParseResult", "Route", "Rule", "Status",
    "decider", "grants",
]  # fmt: skip

STATE_VERSION = 1


# --------------------------------------------------------------------------- on disk


class ApprovalRequest(BaseModel):
    """A need whose lookup waits for the agent (a permission said ``ask``): in state.json."""

    id: str  # stable for this NEED line of this reply; a decision names it
    need: str
    rule: str  # the route rule that matched it
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    why: str = ""  # the permission rule that asks
    asked: str = ""  # when it was first asked (as in state.json's ``updated``)


class ApprovalDecision(BaseModel):
    """The agent's answer to an :class:`ApprovalRequest`, kept in metadata.json ``approvals``
    (the agent's file: the daemon only reads it). ``always`` also lets the same tool with the
    same arguments through in this conversation from then on. The record of what was decided
    (``decision``), through which face (``face``) and when (``time``): a decision is final,
    and a later one about the same lookup is refused naming this one."""

    request: str
    decision: Decision
    need: str = ""
    rule: str = ""
    tool: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    time: str = ""
    face: str = ""  # a Decider; empty in a record written before faces were named
    agent: str = ""  # with face "agent-cli": the agent that ran the CLI ("Claude Code")
    # an ``always`` revoked (``contemplation approvals revoke``): it lets nothing through
    # from then on, and the next such lookup is asked again; when and by which face
    revoked: str = ""
    revoked_by: str = ""  # a Decider
    revoked_agent: str = ""  # with revoked_by "agent-cli": which agent

    @property
    def by(self) -> str:
        """Who decided, in words."""
        return decider(self.face, self.agent)

    @property
    def grants(self) -> bool:
        """An ``always`` not revoked: it lets the same lookup through from now on."""
        return grants(self.decision, self.revoked)


def read_approvals(raw: Any) -> list[ApprovalDecision]:
    """The decisions in a metadata.json ``approvals`` value; an entry that is none is skipped
    (a hand edit cannot make the metadata unreadable)."""
    out: list[ApprovalDecision] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(ApprovalDecision.model_validate(item))
        except ValidationError:
            continue
    return out


class PanelSeat(BaseModel):
    """One model of a panel (metadata.json ``panel``): its name as the backend knows it, the
    label its replies' headers carry, and its backend (empty: the conversation's)."""

    model: str
    label: str
    backend: str = ""


class Metadata(BaseModel):
    """``metadata.json``: what the conversation is and how it talks to its model."""

    model_config = ConfigDict(extra="allow")

    id: str
    topic: str
    created: str
    template: str = "default"
    backend: str = "ollama"
    model: str = "llama3.2"
    agent_label: str = "CLAUDE"
    model_label: str = ""  # empty: named after the backend (OLLAMA, OPENCODE, ...)
    options: dict[str, Any] = Field(default_factory=dict)
    system_prompt: str | None = None
    think: bool | str | None = None
    labels: list[str] = Field(default_factory=list)
    context_requirements: list[dict[str, Any]] = Field(default_factory=list)
    archive_on_complete: bool = True
    # a panel (docs/reference/format.md, "A panel of models"): every message answered by each seat;
    # the agent's messages go to PANEL (model_label), each reply names its seat
    # (left out of metadata.json when unset: a conversation without a panel is unchanged)
    panel: list[PanelSeat] = Field(default_factory=list, exclude_if=lambda v: not v)
    debate: bool = Field(default=False, exclude_if=lambda v: not v)  # also the others' last
    synthesize: PanelSeat | None = Field(default=None, exclude_if=lambda v: v is None)

    def sender_label(self) -> str:
        return self.model_label or self.backend.upper()

    def seats(self) -> list[PanelSeat]:
        """The panel's seats, the synthesizing one last (empty: no panel)."""
        return [*self.panel, *([self.synthesize] if self.panel and self.synthesize else [])]

    def as_seat(self, label: str) -> Metadata:
        """This conversation as one seat of its panel speaks in it: that seat's model and
        backend, and its label on the replies' headers (and on the answers to its needs)."""
        seat = next(s for s in self.seats() if s.label == label)
        return self.model_copy(
            update={
                "model": seat.model,
                "backend": seat.backend or self.backend,
                "model_label": label,
            }
        )

    def approvals(self) -> list[ApprovalDecision]:
        """The agent's decisions about lookups that waited for approval (``approvals``)."""
        return read_approvals((self.model_extra or {}).get(APPROVALS_KEY))


class ErrorInfo(BaseModel):
    kind: str
    message: str
    time: str


class ReplyCut(BaseModel):
    """state.json ``reply_cut``: the last reply was stopped before its end, and why
    (``repeating``: the daemon stopped a model stuck in a loop; ``length``: the server stopped
    at its token limit; ``bytes``: max_reply_bytes; ``time``: the escalation ladder's
    time_budget). Set with the reply's commit, cleared by
    the next reply's."""

    reason: CutReason
    message: str
    tokens: int | None = None  # the reply's tokens, where the server said


class ReplyEnd(BaseModel):
    """state.json ``reply_end``: written by a reply's commit, whose state is recorded (its temp
    file, by name) before the reply's last bytes are appended: where the reply began
    (``offset``), the sha256 of its bytes up to its last ones, and those last bytes
    (``tail``). A crash that kept the record and not those bytes (a kill after the server
    said ``done``) is finished by recovery: the log checked against it, the bytes appended,
    the commit renamed in; the model is not asked again."""

    offset: int
    sha256: str
    tail: str


class Crashes(BaseModel):
    """Turns of the same message that raised something unexpected once they had begun (a
    reply no code was ready for): redone once, then given up (see ``retrying.crashed``).
    Counted for the turn after ``turns`` turns and ``messages`` messages: a turn that ends,
    or a new message, starts the count again."""

    turns: int
    messages: int
    cause: str  # the last one: "RecursionError: maximum recursion depth exceeded ..."
    same: int = 1  # times in a row with this cause
    total: int = 1


class Intent(BaseModel):
    """A write that is about to happen to ``messages.log`` (journal for crash recovery)."""

    kind: Literal["message", "reply"]
    id: str
    offset: int
    length: int = 0  # known up front for messages; grows for replies
    sha256: str = ""


class LogIdentity(BaseModel):
    ino: int = 0
    size: int = 0  # bytes of messages.log accounted for (ours + adopted foreign bytes)


class Rotation(BaseModel):
    """A rotation of ``messages.log`` in progress (journal: recovery completes it)."""

    segments: int  # highest N of the messages.N.log segments before the rotation
    ino: int  # inode of the messages.log being rotated


class TurnStarted(BaseModel):
    """A model turn whose request went out and that has not ended (no reply, error, retry or
    cancel since): which turn (the one after ``turns`` turns and ``messages`` messages), the
    daemon run that began it last, and how many runs in a row began it. Found by a later
    run, it is a turn a daemon died during (see :mod:`contemplation.engine.inflight`)."""

    turns: int
    messages: int
    run: str  # the run that began it (a token of the dispatcher's, or of a burst's)
    starts: int = 1


# Why a turn's server recomputed more than the turn's new text (contemplation.protocol.ledger):


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt_eval_count: int | None = None
    eval_count: int | None = None
    total_duration_ms: float | None = None
    load_duration_ms: float | None = None
    prompt_eval_duration_ms: float | None = None
    eval_duration_ms: float | None = None
    first_token_ms: float | None = None
    wall_ms: float | None = None
    done_reason: str | None = None
    context_window: int | None = None
    context_full: bool = False
    # the ledger's (None: the server did not say; never guessed): prompt tokens the server
    # took from its cache, and those it computed again (sent = both, when both are known)
    cached_tokens: int | None = None
    computed_tokens: int | None = None
    miss: MissCause | None = None  # why the server recomputed what it held (ledger.miss)
    queued_ms: float | None = None  # waiting for the daemon's slot on the provider
    provider: str | None = None  # the provider that answered, and the server's model name
    model: str | None = None


LEDGER_TURNS_KEPT = 100  # turns listed one by one in state.json (all are in the sums)
LEDGER_KEYS_KEPT = 16  # provider/model pairs summed apart in one conversation


class LedgerSums(BaseModel):
    """Where the tokens and the time of some turns went (summed; None: no turn said)."""

    turns: int = 0
    sent: int | None = None  # prompt tokens sent
    reused: int | None = None  # of them, taken from the server's cache
    recomputed: int | None = None  # of them, computed again (prefilled)
    output: int | None = None
    queued_ms: float | None = None
    load_ms: float | None = None
    prefill_ms: float | None = None
    generate_ms: float | None = None
    context_bytes: int = 0  # read by the daemon for the model, never in the agent's context


class LedgerTurn(LedgerSums):
    turn: int = 0  # the conversation's turn number (1 is the first)
    provider: str = ""
    model: str = ""
    miss: MissCause | None = None  # why it recomputed more than its new text (None: it did not)


class Ledger(BaseModel):
    """state.json ``ledger``: the last turns one by one, and every turn summed per
    provider/model ("provider/model" keys)."""

    turns: list[LedgerTurn] = Field(default_factory=list)
    by: dict[str, LedgerSums] = Field(default_factory=dict)
    unturned_bytes: int = 0  # context read since the last turn: counted with the next one


class BackendSession(BaseModel):
    """A conversation's session on a server that keeps the history itself (OpenCode): which
    one, and what it holds, so a restarted daemon goes on in it and a diverged history is seen.
    Reported by the backend after a reply; recorded with the reply's commit."""

    model_config = ConfigDict(extra="allow")

    backend: str  # the backend family that made it ("opencode")
    provider: str = ""  # the provider that holds it: the conversation's turns stay there
    id: str  # the server's id ("ses_…")
    messages: int = 0  # how many messages of the history (system prompt aside) it holds
    digest: str = ""  # sha256 of those messages (roles, and the text of all but replies)
    last_message: str = ""  # the server's id of its last message ("msg_…"; "": unknown)


LADDER_STEPS_KEPT = 100  # a ladder's steps listed one by one in state.json (all are counted)


class LadderStep(BaseModel):
    """One reply on a conversation's escalation ladder: the rung it ran on ("": the
    conversation's own model), the server's model, and, when it failed, the cause and the rung
    the turn went to (None: it answered)."""

    turn: int = 0
    rung: str = ""
    model: str = ""
    cause: str | None = None
    to: str | None = None


class LadderBook(BaseModel):
    """What a conversation's ladder did and saved: turns answered at each rung ("": its own
    model), turns that reached the agent, and the frontier tokens those answered locally did
    not spend (an estimate: each answered turn's prompt, as the server counted it or as
    estimated, and its reply)."""

    answered: dict[str, int] = Field(default_factory=dict)
    escalated: int = 0
    to_agent: int = 0
    saved_tokens_estimate: int = 0
    steps: list[LadderStep] = Field(default_factory=list)


class State(BaseModel):
    """``state.json``: the machine state. The log is the truth; this is journal + cache."""

    model_config = ConfigDict(extra="allow")

    version: int = STATE_VERSION
    status: Status = Status.PENDING
    messages_processed: int = 0
    turns: int = 0
    log: LogIdentity = Field(default_factory=LogIdentity)
    intent: Intent | None = None
    rotation: Rotation | None = None
    done_ids: list[str] = Field(default_factory=list)
    pending_needs: list[str] = Field(default_factory=list)
    pending_approvals: list[ApprovalRequest] = Field(default_factory=list)
    last_error: ErrorInfo | None = None
    retry_count: int = 0
    next_retry_at: float | None = None
    retry_settings: str = ""  # fingerprint of the backend's settings when the backoff was set
    crashes: Crashes | None = None  # the current turn's unexpected failures (retrying.crashed)
    last_turn: Usage | None = None
    reply_cut: ReplyCut | None = None  # the last reply stopped before its end
    reply_end: ReplyEnd | None = None  # a reply's commit record: how to finish it (recovery)
    ledger: Ledger = Field(default_factory=Ledger)
    # the escalation ladder's own book (absent for a conversation without a ladder)
    ladder: LadderBook | None = Field(None, exclude_if=lambda v: v is None)
    generating_since: float | None = None  # epoch seconds the last turn took its backend slot
    turn_started: TurnStarted | None = None  # the turn in flight (contemplation.engine.inflight)
    backend_session: BackendSession | None = None  # the server-side session of the history
    parse_errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    updated: str = ""


# --------------------------------------------------------------------------- in memory


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    options: dict[str, Any] = field(default_factory=dict)
    think: bool | str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    conversation_id: str = ""
    session: BackendSession | None = None  # what state.json says the server already holds
    schema: dict[str, Any] | None = None  # a JSON Schema the reply must match (structured.py)
    slot: int | None = None  # the server slot holding this conversation's cache (id_slot)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One piece of a streamed reply. Exactly one of the fields is meaningful per kind.

    ``note`` is something the log should show about how the reply was made (e.g. a fallback
    to another backend); it is written as a ``=== NOTE: ... ===`` line. ``session`` is the
    server-side session that now holds the history and this reply (recorded in state.json).
    """

    kind: Literal["content", "thinking", "tool_call", "note", "session", "done"]
    text: str = ""
    tool_call: dict[str, Any] | None = None
    usage: Usage | None = None
    session: BackendSession | None = None
