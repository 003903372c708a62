"""The turn's state in one place: what the step that decided it holds (:class:`Turn`), what
is settled before a slot (:class:`Prepared`), where it runs (:class:`On`) and the reply being
written with its slot (:class:`Attempt`). The phases take these, never their pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contemplation.backends.providers import Target
from contemplation.engine.breaker import Guard
from contemplation.engine.escalation import At
from contemplation.engine.prefetch import Ahead
from contemplation.engine.provider import Provider
from contemplation.engine.runtime import Runtime
from contemplation.engine.scheduler import Held
from contemplation.engine.tracking import Tracked
from contemplation.errors import BackendError
from contemplation.models import Metadata
from contemplation.store.layout import Conv
from contemplation.writer import ConvWriter, LiveReply


class Gone(Exception):
    """The conversation's folder was deleted while its reply streamed: stop the stream."""


class Cancelled(Exception):
    """The agent asked to cancel the in-flight generation."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One model turn, under the lock and writer of the step that decided it."""

    conv: Conv
    rt: Runtime
    seen: Tracked
    w: ConvWriter
    ahead: Ahead | None = None  # a panel's seats asked ahead in this session (prefetch.py)
    # whose caches the turn uses (its server slot, its prompt counts): the conversation's,
    # or in a panel the seat's it speaks as (the writer's metadata, set for the whole turn)
    key: str = field(init=False)

    def __post_init__(self) -> None:
        meta = self.w.meta
        key = f"{self.conv.id}#{meta.model_label}" if meta.panel else self.conv.id
        object.__setattr__(self, "key", key)  # frozen: worked out once, for the whole turn

    def check_cancel(self) -> None:
        """Raise :class:`Cancelled` when the agent asked to cancel the turn."""
        if self.conv.cancel_flag.exists():
            raise Cancelled


@dataclass(frozen=True, slots=True)
class Prepared:
    """What is settled before the slot: the metadata as served (the alias's model, options and
    think), context text, tools offered, the think value."""

    meta: Metadata
    context: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    think: bool | str | None = None
    note: str | None = None  # a downgrade to record in the log
    error: BackendError | None = None  # a request the model cannot serve
    window: int | None = None  # the tokens a request gets, when the backend knows
    vision: bool = True  # the model can see images (unknown: let the server say)
    constrains: bool = False  # every provider can hold a reply to a JSON Schema
    tokenizer: Provider | None = None  # a provider whose server counts tokens (llama-server)
    asking: bool = True  # offered NEED lines and tools (not a panel rung's seat: its answer)


@dataclass(frozen=True, slots=True)
class On:
    """Where this turn runs: the provider whose slot it holds, the server's model name, the
    conversation's target (all the providers it may use), the provider's breakers and the
    provider itself (``host``), which the turn asks for its client, slots and caches."""

    provider: str
    target: Target
    guard: Guard
    host: Provider
    queued_ms: float | None = None  # waited for the provider's slot (the ledger's)
    slot: int | None = None  # the server slot the turn names (llama-server id_slot)
    rung: At | None = None  # where the turn stands on its conversation's escalation ladder
    model: str = field(init=False)  # the server's name for the model (the target's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", self.target.model)


@dataclass(frozen=True, slots=True)
class Attempt:
    """The turn with its slot held and its reply begun: what streaming and every way the
    turn ends need."""

    turn: Turn
    prepared: Prepared
    on: On
    held: Held
    reply: LiveReply
    # the turn's, at hand (fields, not properties: read at every streamed event)
    conv: Conv = field(init=False)
    rt: Runtime = field(init=False)
    w: ConvWriter = field(init=False)

    def __post_init__(self) -> None:
        for name in ("conv", "rt", "w"):
            object.__setattr__(self, name, getattr(self.turn, name))
